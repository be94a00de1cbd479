#!/usr/bin/env python3
"""Trains beam-nano's byte-level BPE on generated conversations and writes tokenizer.json. Pure Python 3.

  python3 tools/tokenizer/train_bpe.py --data DIR/train.jsonl --out tokenizer.json [--vocab-size 4096]
                                       [--max-examples 20000]

Ids: the 256 byte tokens first (id = byte value), then one token per merge in merge order, then the Harmony
special tokens at the top ids (vocab_size - 9 .. vocab_size - 1). Numbers are never merged: every digit stays
its own token, which makes the step-by-step arithmetic the model learns digit-wise. A merge whose result
already exists as a token is skipped, so every token has exactly one merge that makes it.
"""
import argparse
import collections
import heapq
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import (BYTE_TO_CHAR, HARMONY_SPECIAL_TOKENS, PreTokenizer, Tokenizer,  # noqa: E402
                 tokenizer_json)


def count_words(texts, special_tokens):
    pre = PreTokenizer()
    counts = collections.Counter()
    for text in texts:
        pieces = [text]
        for special in special_tokens:
            pieces = [part for piece in pieces for part in piece.split(special)]
        for piece in pieces:
            counts.update(pre.split(piece))
    return counts


def train(word_counts, num_merges):
    words, freqs = [], []
    for word, count in word_counts.items():
        if word.isdigit():
            continue
        words.append([BYTE_TO_CHAR[b] for b in word.encode("utf-8")])
        freqs.append(count)
    pair_counts = collections.Counter()
    where = collections.defaultdict(set)
    for index, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += freqs[index]
            where[pair].add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    existing = set(BYTE_TO_CHAR.values())
    merges = []
    while len(merges) < num_merges and heap:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative or -negative <= 0:
            continue
        merged = pair[0] + pair[1]
        if merged in existing:
            del pair_counts[pair]
            continue
        merges.append(pair)
        existing.add(merged)
        changed = set()
        for index in list(where[pair]):
            symbols = words[index]
            if len(symbols) < 2:
                continue
            old = collections.Counter(zip(symbols, symbols[1:]))
            if pair not in old:
                continue
            new_symbols, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == pair[0] and symbols[i + 1] == pair[1]:
                    new_symbols.append(merged)
                    i += 2
                else:
                    new_symbols.append(symbols[i])
                    i += 1
            words[index] = new_symbols
            new = collections.Counter(zip(new_symbols, new_symbols[1:]))
            for p in set(old) | set(new):
                delta = (new[p] - old[p]) * freqs[index]
                if delta:
                    pair_counts[p] += delta
                    changed.add(p)
                if new[p]:
                    where[p].add(index)
        del where[pair]
        pair_counts.pop(pair, None)
        for p in changed:
            if pair_counts.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
    return merges


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="train.jsonl from tools/data/generate.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--max-examples", type=int, default=20000)
    args = parser.parse_args()
    texts = []
    with open(args.data) as f:
        for line in f:
            texts.append("".join(text for text, _ in json.loads(line)["segments"]))
            if len(texts) >= args.max_examples:
                break
    num_merges = args.vocab_size - 256 - len(HARMONY_SPECIAL_TOKENS)
    counts = count_words(texts, HARMONY_SPECIAL_TOKENS)
    merges = train(counts, num_merges)
    if len(merges) < num_merges:
        sys.exit(f"only {len(merges)} merges possible on this data; need {num_merges}")
    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    for rank, (a, b) in enumerate(merges):
        vocab[a + b] = 256 + rank
    first_special = 256 + len(merges)
    specials = {t: first_special + i for i, t in enumerate(HARMONY_SPECIAL_TOKENS)}
    with open(args.out, "w") as f:
        json.dump(tokenizer_json(vocab, merges, specials), f, ensure_ascii=False, indent=None)
        f.write("\n")
    tokenizer = Tokenizer.load(args.out)
    sample = texts[: min(len(texts), 2000)]
    total_chars = sum(len(t) for t in sample)
    total_tokens = sum(len(tokenizer.encode(t)) for t in sample)
    for text in sample[:200]:
        if tokenizer.decode(tokenizer.encode(text)) != text:
            sys.exit("round trip failed")
    print(f"{len(counts)} distinct words; {len(merges)} merges; vocab {tokenizer.vocab_size()}; "
          f"{total_chars / total_tokens:.2f} chars/token on {len(sample)} conversations")


if __name__ == "__main__":
    main()

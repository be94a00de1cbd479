#!/usr/bin/env python3
"""Checks bpe.py against independent readers of the same tokenizer.json, where they are installed
(both are on the GPU machine): Hugging Face `tokenizers` (ids of whole conversations, special tokens
included) and the `regex` module (the o200k pattern as written vs bpe.py's ASCII transcription).

  python3 tools/tokenizer/check_tokenizer.py TOKENIZER_JSON DATA_JSONL [--limit 2000]

Exits 1 on any difference; says which checks it skipped for want of a package.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import O200K_ASCII_PATTERN, O200K_PATTERN, Tokenizer  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tokenizer")
    parser.add_argument("data")
    parser.add_argument("--limit", type=int, default=2000)
    args = parser.parse_args()
    texts = []
    with open(args.data) as f:
        for line in f:
            texts.append("".join(t for t, _ in json.loads(line)["segments"]))
            if len(texts) >= args.limit:
                break
    ours = Tokenizer.load(args.tokenizer)
    failures = 0
    try:
        import regex
        full, ascii_only = regex.compile(O200K_PATTERN), re.compile(O200K_ASCII_PATTERN)
        probes = texts + ["Hello World's 12345 x\n\n  y  \t\r\nz//", "it's THE'S  A-B_c 1.5e10 ...!!\n", "  \n "]
        mismatched = [t for t in probes if full.findall(t) != ascii_only.findall(t)]
        failures += len(mismatched)
        print(f"pre-tokenizer: o200k (regex module) vs ASCII transcription: {len(probes) - len(mismatched)}"
              f"/{len(probes)} texts identical")
    except ImportError:
        print("pre-tokenizer check skipped: no `regex` module")
    try:
        from tokenizers import Tokenizer as HFTokenizer
        hf = HFTokenizer.from_file(args.tokenizer)
        same = 0
        for text in texts:
            theirs = hf.encode(text, add_special_tokens=False).ids
            if theirs == ours.encode(text):
                same += 1
            elif failures < 3:
                print("differs:", repr(text[:200]))
            if hf.decode(theirs, skip_special_tokens=False) != text:
                failures += 1
        failures += len(texts) - same
        print(f"ids: Hugging Face tokenizers vs bpe.py: {same}/{len(texts)} conversations identical")
    except ImportError:
        print("Hugging Face check skipped: no `tokenizers` module")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

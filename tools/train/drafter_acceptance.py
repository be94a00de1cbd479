#!/usr/bin/env python3
"""Acceptance of a block drafter under greedy verification (temperature 0), simulated in PyTorch.

  python3 tools/train/drafter_acceptance.py --target models/beam-nano --drafter models/beam-nano-drafter \
      [--conversations 300] [--k 7] [--json acceptance.json]

The target greedily completes every model turn of the first N held-out conversations (generate.py's held-out
split, seed 1 + 7777: the conversations beam-nano held out). Greedy verification accepts the longest prefix of
the K draft tokens that equals the target's own argmax continuation, then adds the target's bonus token, so it
is replayed exactly on the target's greedy completion S: from the first generated token on (anchor P = prompt
length; the prefill produced S[P]), the drafter drafts d_1..d_K from the context features of S[0..P-1] and the
anchor S[P]; n = the number of leading d_i equal to S[P+i]; the step commits min(n + 1, E - P) tokens (E: the
last position; the stop token ends the turn without a bonus) and the next anchor is P + that. Every anchor's
draft comes from one block-sparse drafter pass per batch of turns (drafter_torch.draft), FP32, with the weights
as stored.

Reports the mean acceptance length (1 + accepted / drafts, as vLLM's spec-decode metrics count it), the mean
tokens per target step (bonus capped at the end of a turn), and per draft position k the rate at which the first
k drafts were all accepted (vllm:spec_decode_num_accepted_tokens_per_pos_total / num_drafts), overall and per
task kind.
"""
import argparse
import json
import os
import random
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "data"))
sys.path.insert(0, os.path.join(ROOT, "tools", "tokenizer"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import generate  # noqa: E402
from beam_torch import greedy_generate, load_checkpoint  # noqa: E402
from bpe import Tokenizer  # noqa: E402
from drafter_torch import draft, load_drafter  # noqa: E402


def heldout_turns(tokenizer, conversations, seed=1):
    """(kind, prompt ids) of every model turn of the first `conversations` held-out conversations."""
    turns = []
    for split, job_seed, count in generate.split_jobs("heldout", conversations, seed + generate.HELDOUT_SEED_OFFSET):
        rng = random.Random(job_seed)
        for _ in range(count):
            example = generate.make_example(rng, split)
            for turn in example["turns"]:
                turns.append((example["kind"], tokenizer.encode(turn["prompt"])))
    return turns


def stop_ids(tokenizer):
    return [tokenizer.token_id("<|return|>"), tokenizer.token_id("<|call|>")]


def complete(target, prompts, stops, max_new_tokens, device, batch, autocast):
    """Greedy completions (lists of ids, stop token included), prompts sorted by length into batches."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [None] * len(prompts)
    for begin in range(0, len(order), batch):
        chunk = order[begin:begin + batch]
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast and device == "cuda"):
            outputs = greedy_generate(target, [prompts[i] for i in chunk], stops, max_new_tokens, device)
        for i, output in zip(chunk, outputs):
            out[i] = output
    return out


@torch.no_grad()
def drafts_for(target, drafter, sequences, device, batch=16):
    """For each (ids, prompt length L): argmax drafts [E - L, B-1] at every anchor P = L .. E-1 (E = len - 1)."""
    out = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    for begin in range(0, len(order), batch):
        chunk = [i for i in order[begin:begin + batch] if len(sequences[i][0]) - 1 > sequences[i][1]]
        if not chunk:
            continue
        longest = max(len(sequences[i][0]) for i in chunk)
        anchors_per = max(len(sequences[i][0]) - 1 - sequences[i][1] for i in chunk)
        tokens = torch.zeros(len(chunk), longest, dtype=torch.long)
        anchors = torch.zeros(len(chunk), anchors_per, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids, start = sequences[i]
            tokens[row, :len(ids)] = torch.tensor(ids)
            count = len(ids) - 1 - start
            anchors[row, :count] = torch.arange(start, start + count)
            anchors[row, count:] = start                 # padding anchors: computed, never read
        logits = draft(target, drafter, tokens.to(device), anchors.to(device))
        best = logits.argmax(-1).cpu().numpy()
        for row, i in enumerate(chunk):
            ids, start = sequences[i]
            out[i] = best[row, :len(ids) - 1 - start]
    return out


def replay(ids, start, drafts, k):
    """Greedy verification replayed on one completion: (steps, tokens committed, accepted per step list)."""
    end = len(ids) - 1
    p, steps, tokens, accepted = start, 0, 0, []
    while p < end:
        proposal = drafts[p - start][:k]
        n = 0
        while n < len(proposal) and p + 1 + n <= end and proposal[n] == ids[p + 1 + n]:
            n += 1
        committed = min(n + 1, end - p)
        steps += 1
        tokens += committed
        accepted.append(n)
        p += committed
    return steps, tokens, accepted


def summarize(accepted, steps, tokens, k):
    drafts = len(accepted)
    counts = np.array(accepted, dtype=np.int64)
    per_pos = [float((counts >= pos).mean()) if drafts else 0.0 for pos in range(1, k + 1)]
    return {"drafts": drafts, "accepted_tokens": int(counts.sum()),
            "mean_acceptance_length": 1.0 + float(counts.mean()) if drafts else 0.0,
            "mean_tokens_per_step": tokens / steps if steps else 0.0,
            "acceptance_per_position": per_pos}


def measure(target, drafter, tokenizer, conversations, k, device, max_new_tokens=384, log=print):
    """Generates the held-out completions (FP32) and replays greedy verification; returns the report dict."""
    started = time.time()
    turns = heldout_turns(tokenizer, conversations)
    prompts = [ids for _, ids in turns]
    completions = complete(target, prompts, stop_ids(tokenizer), max_new_tokens, device, 512, autocast=False)
    sequences = [(prompt + completion, len(prompt)) for prompt, completion in zip(prompts, completions)]
    drafts = drafts_for(target, drafter, sequences, device)
    by_kind = {}
    for (kind, _), (ids, start), proposal in zip(turns, sequences, drafts):
        if proposal is None:
            continue
        steps, tokens, accepted = replay(ids, start, proposal, k)
        for key in ("all", kind):
            entry = by_kind.setdefault(key, [[], 0, 0])
            entry[0].extend(accepted)
            entry[1] += steps
            entry[2] += tokens
    report = {"k": k, "conversations": conversations, "turns": len(turns),
              "generated_tokens": int(sum(len(c) for c in completions)),
              "seconds": round(time.time() - started, 1),
              "overall": summarize(*by_kind.pop("all"), k),
              "by_kind": {kind: summarize(*entry, k) for kind, entry in sorted(by_kind.items())}}
    o = report["overall"]
    log(f"acceptance at K={k}, greedy, {report['turns']} held-out turns ({report['generated_tokens']} generated "
        f"tokens): mean acceptance length {o['mean_acceptance_length']:.3f}, mean tokens per target step "
        f"{o['mean_tokens_per_step']:.3f}; per position " + " ".join(f"{r:.3f}" for r in o["acceptance_per_position"]))
    for kind, entry in report["by_kind"].items():
        log(f"  {kind:16s} drafts {entry['drafts']:6d} mean acceptance length {entry['mean_acceptance_length']:.3f}")
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--k", type=int, default=7, help="num_speculative_tokens")
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    target = load_checkpoint(args.target, device)
    drafter = load_drafter(args.drafter, target.config, device)
    if args.k > drafter.config.block_size - 1:
        sys.exit(f"--k {args.k} exceeds block_size - 1 = {drafter.config.block_size - 1}")
    tokenizer = Tokenizer.load(os.path.join(args.target, "tokenizer.json"))
    report = measure(target, drafter, tokenizer, args.conversations, args.k, device, args.max_new_tokens)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Greedy-decodes every held-out turn with the PyTorch model and scores it (harmony_check.py).

  python3 tools/train/eval_torch.py --model models/beam-nano --heldout heldout.jsonl [--limit 1000]
                                    [--json results.json]

Prints, per task kind and overall: % of completions that are valid Harmony, % of tool-call turns with the
right function and schema-valid JSON arguments (and % with exactly the expected arguments), % of numeric
answers that are correct, and % of other checks passed.
"""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "tokenizer"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from beam_torch import greedy_generate, load_checkpoint  # noqa: E402
from bpe import Tokenizer  # noqa: E402
from harmony_check import score, summarize  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--limit", type=int, default=1000, help="conversations to use")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=400)
    parser.add_argument("--json", help="write per-turn results here")
    parser.add_argument("--summary", help="write the headline figures here ({name: [passed, total]})")
    parser.add_argument("--seconds", type=float, help="start no batch that would end after this many seconds "
                        "(the summary then covers the turns decoded, shortest prompts first, and says so)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_checkpoint(args.model, device)
    tokenizer = Tokenizer.load(os.path.join(args.model, "tokenizer.json"))
    stops = [tokenizer.token_id("<|return|>"), tokenizer.token_id("<|call|>")]
    turns = []
    with open(args.heldout) as f:
        for index, line in enumerate(f):
            if index >= args.limit:
                break
            example = json.loads(line)
            for turn in example["turns"]:
                turns.append((example["kind"], turn["prompt"], turn["check"]))
    turns.sort(key=lambda t: len(t[1]))
    started = time.time()
    results = []
    slowest = 0.0
    for begin in range(0, len(turns), args.batch):
        if args.seconds is not None and time.time() - started + 1.5 * slowest > args.seconds:
            print(f"out of time: {len(results)} of {len(turns)} turns decoded")
            break
        batch_started = time.time()
        chunk = turns[begin:begin + args.batch]
        prompts = [tokenizer.encode(prompt) for _, prompt, _ in chunk]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            outputs = greedy_generate(model, prompts, stops, args.max_new_tokens, device)
        for (kind, prompt, check), output in zip(chunk, outputs):
            completion = tokenizer.decode(output)
            results.append({"kind": kind, "check": check, "completion": completion,
                            **score(completion, check, prompt)})
        slowest = max(slowest, time.time() - batch_started)
    seconds = time.time() - started

    print(f"{len(results)} turns decoded in {seconds:.0f} s")
    figures = summarize(results)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"model": args.model, "heldout": args.heldout, "turns": len(results),
                       "turns_in_set": len(turns), "seconds": round(seconds),
                       "figures": figures}, f, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

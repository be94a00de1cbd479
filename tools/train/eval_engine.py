#!/usr/bin/env python3
"""Held-out eval through the C++ engine: prompts encoded by `beamline tokenize`, greedy completions from
`beamline generate` (stops at the checkpoint's eos ids), decoded by `beamline detokenize`, scored by
harmony_check.py (the same figures eval_torch.py prints for the PyTorch model). Pure Python 3.

  python3 tools/data/generate.py --out DIR --train 0 --heldout 1000 --ood 1000 --seed 1   # beam-nano's held-out sets
  python3 tools/train/eval_engine.py --beamline build/apps/beamline/beamline --model models/beam-nano \
      --heldout DIR/heldout.jsonl [--limit 1000] [--device cpu] [--json results.json]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harmony_check import score, summarize  # noqa: E402


def run(command, stdin=None):
    done = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command[:2])} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def load_turns(heldout, limit):
    """(kind, prompt, check) of every model turn of the first `limit` conversations."""
    turns = []
    with open(heldout) as f:
        for index, line in enumerate(f):
            if index >= limit:
                break
            example = json.loads(line)
            turns += [(example["kind"], t["prompt"], t["check"]) for t in example["turns"]]
    return turns


def encode(beamline, model, prompts):
    """Token ids (lists of ints) of each prompt, special tokens allowed."""
    encoded = run([beamline, "tokenize", "--model", model, "--allow-special", "--jsonl"],
                  "".join(json.dumps(prompt) + "\n" for prompt in prompts)).splitlines()
    if len(encoded) != len(prompts):
        sys.exit(f"beamline tokenize returned {len(encoded)} lines for {len(prompts)} prompts")
    return [[int(token) for token in line.split()] for line in encoded]


def evaluate(beamline, model, turns, encoded, max_tokens=400, device="cpu", extra=()):
    """Greedy completions of every turn by `beamline generate`, scored; each result also keeps the generated ids."""
    results = []
    for (kind, prompt, check), ids in zip(turns, encoded):
        output = run([beamline, "generate", "--model", model, "--tokens", ",".join(map(str, ids)),
                      "--max-tokens", str(max_tokens), "--device", device, *extra]).splitlines()
        id_lines = [line for line in output if line.strip() and set(line.strip()) <= set("0123456789, ")]
        generated = id_lines[-1].strip() if id_lines else ""
        completion = run([beamline, "detokenize", "--model", model, "--ids", generated]) if generated else ""
        results.append({"kind": kind, "check": check, "completion": completion,
                        "generated": [int(t) for t in generated.replace(",", " ").split()], **score(completion, check, prompt)})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--limit", type=int, default=1000, help="conversations to use")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write per-turn results here")
    args = parser.parse_args()
    turns = load_turns(args.heldout, args.limit)
    encoded = encode(args.beamline, args.model, [prompt for _, prompt, _ in turns])
    started = time.time()
    results = evaluate(args.beamline, args.model, turns, encoded, args.max_tokens, args.device)
    print(f"{len(results)} turns decoded by beamline ({args.device}) in {time.time() - started:.0f} s")
    summarize(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

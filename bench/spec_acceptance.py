#!/usr/bin/env python3
"""Speculative decoding's acceptance on beam-nano's held-out prompts (CPU is enough: acceptance does not depend on
the device). For each model turn, `beamline generate --speculative-config ...` (greedy, the serving engine) and the
same without speculation: the outputs must be equal token for token; the log's draft counters are summed into the
mean tokens per target step with a draft (1 + accepted / drafts) and the acceptance rate per draft position. Pure
Python 3.

  python3 tools/data/generate.py --out DIR --train 0 --heldout 1000 --seed 1     # beam-nano's held-out set
  python3 bench/spec_acceptance.py --beamline build/apps/beamline/beamline --model models/beam-nano \
      --heldout DIR/heldout.jsonl --limit 40 --k 7
"""
import argparse
import json
import re
import subprocess
import sys
import time


def run(command, stdin=None):
    done = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command[:2])} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout, done.stderr


STATS = re.compile(r"speculative decoding: (\d+) drafts, (\d+) draft tokens, (\d+) accepted; .* per position \[([\d,]*)\]")
STEPS = re.compile(r"generated (\d+) tokens in (\d+) engine steps")


def ids_line(output):
    lines = [line for line in output.splitlines() if line.strip() and set(line.strip()) <= set("0123456789,")]
    return lines[-1] if lines else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--limit", type=int, default=40, help="conversations to use")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--k", type=int, default=7, help="num_speculative_tokens")
    parser.add_argument("--min", type=int, default=1, help="prompt_lookup_min")
    parser.add_argument("--max", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--drafter", help="a dflash drafter directory: block drafts from it instead of n-gram lookup")
    args = parser.parse_args()
    turns = []
    with open(args.heldout) as f:
        for index, line in enumerate(f):
            if index >= args.limit:
                break
            turns += [t["prompt"] for t in json.loads(line)["turns"]]
    encoded, _ = run([args.beamline, "tokenize", "--model", args.model, "--allow-special", "--jsonl"],
                     "".join(json.dumps(prompt) + "\n" for prompt in turns))
    encoded = encoded.splitlines()
    if args.drafter:
        config = json.dumps({"method": "dflash", "model": args.drafter, "num_speculative_tokens": args.k})
        method = f"dflash ({args.drafter}) K={args.k}"
    else:
        config = json.dumps({"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": args.min,
                             "prompt_lookup_max": args.max})
        method = f"ngram K={args.k} lookup {args.min}..{args.max}"
    drafts = draft_tokens = accepted = tokens = steps = mismatches = 0
    per_position = [0] * args.k
    started = time.time()
    for ids in encoded:
        base = [args.beamline, "generate", "--model", args.model, "--tokens", ",".join(ids.split()),
                "--max-tokens", str(args.max_tokens), "--device", "cpu"]
        plain, _ = run(base)
        spec, errors = run(base + ["--speculative-config", config])
        log = spec + errors  # spdlog writes to stdout; the ids are its one line of digits and commas
        if ids_line(plain) != ids_line(spec):
            mismatches += 1
        found = STATS.search(log)
        counted = STEPS.search(log)
        if not found or not counted:
            sys.exit(f"no speculative decoding counters in the log: {log[-500:]}")
        drafts += int(found[1])
        draft_tokens += int(found[2])
        accepted += int(found[3])
        for i, count in enumerate(int(c) for c in found[4].split(",") if c):
            per_position[i] += count
        tokens += int(counted[1])
        steps += int(counted[2])
    print(f"{len(encoded)} turns, {method}, {time.time() - started:.0f} s")
    print(f"outputs equal to those without speculation: {len(encoded) - mismatches}/{len(encoded)}")
    print(f"{tokens} tokens in {steps} engine steps (prefill steps included): {tokens / max(1, steps):.3f} tokens per step")
    print(f"{drafts} drafts, {draft_tokens} draft tokens, {accepted} accepted ({accepted / max(1, draft_tokens):.1%})")
    print(f"mean tokens per target step with a draft (accepted + 1): {1 + accepted / max(1, drafts):.3f}")
    print("acceptance rate per position (accepted at i / drafts): " +
          ", ".join(f"{i}: {c / max(1, drafts):.3f}" for i, c in enumerate(per_position)))
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()

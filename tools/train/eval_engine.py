#!/usr/bin/env python3
"""Held-out eval through the C++ engine: prompts encoded by `beamline tokenize`, greedy completions from
`beamline generate` (stops at the checkpoint's eos ids), decoded by `beamline detokenize`, scored by
harmony_check.py (the same figures eval_torch.py prints for the PyTorch model). Pure Python 3.

With --constrained each turn is generated under the Harmony template constraint as `serve` applies it to a chat turn
(`beamline generate --harmony-tools` with the turn's declared tools, from the check's "tools"), and the eval also
reports how many calls' arguments validate against the called tool's schema; --temperature / --seed sample (turn i
draws with seed + i).

  python3 tools/data/generate.py --out DIR --train 0 --heldout 1000 --ood 1000 --seed 1   # beam-nano's held-out sets
  python3 tools/train/eval_engine.py --beamline build/apps/beamline/beamline --model models/beam-nano \
      --heldout DIR/heldout.jsonl [--limit 1000] [--device cpu] [--json results.json] \
      [--constrained] [--temperature 1.0 --seed 1000]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harmony_check import parse_completion, schema_errors, score, summarize  # noqa: E402


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


def evaluate(beamline, model, turns, encoded, max_tokens=400, device="cpu", extra=(), constrained=False, seed=None):
    """Completions of every turn by `beamline generate` (greedy unless `extra` sets a temperature), scored; each result
    also keeps the generated ids. `constrained`: under the Harmony constraint with the turn's declared tools."""
    results = []
    for index, ((kind, prompt, check), ids) in enumerate(zip(turns, encoded)):
        per_turn = list(extra)
        if constrained:
            if "tools" not in check:
                sys.exit("--constrained: the held-out set has no \"tools\" in its checks (tools/data/generate.py writes them)")
            per_turn += ["--harmony-tools", json.dumps(check["tools"])]
        if seed is not None:
            per_turn += ["--seed", str(seed + index)]
        output = run([beamline, "generate", "--model", model, "--tokens", ",".join(map(str, ids)),
                      "--max-tokens", str(max_tokens), "--device", device, *per_turn]).splitlines()
        id_lines = [line for line in output if line.strip() and set(line.strip()) <= set("0123456789, ")]
        generated = id_lines[-1].strip() if id_lines else ""
        completion = run([beamline, "detokenize", "--model", model, "--ids", generated]) if generated else ""
        results.append({"kind": kind, "check": check, "completion": completion,
                        "generated": [int(t) for t in generated.replace(",", " ").split()], **score(completion, check, prompt)})
    return results


def call_arguments_figure(results):
    """[calls whose arguments validate against the called tool's parameters, calls] over the valid completions."""
    passed = total = 0
    for r in results:
        try:
            messages = parse_completion(r["completion"])
        except ValueError:
            continue
        schemas = {t["name"]: t["parameters"] for t in r["check"].get("tools", [])}
        for recipient, _, content, _ in messages:
            if not recipient:
                continue
            total += 1
            try:
                passed += recipient in schemas and not schema_errors(json.loads(content), schemas[recipient] or {"type": "object"})
            except ValueError:
                pass
    return [passed, total]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--limit", type=int, default=1000, help="conversations to use")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write per-turn results here")
    parser.add_argument("--constrained", action="store_true", help="the Harmony constraint with each turn's tools")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, help="turn i samples with seed + i")
    args = parser.parse_args()
    turns = load_turns(args.heldout, args.limit)
    encoded = encode(args.beamline, args.model, [prompt for _, prompt, _ in turns])
    started = time.time()
    results = evaluate(args.beamline, args.model, turns, encoded, args.max_tokens, args.device,
                       ["--temperature", str(args.temperature)], args.constrained, args.seed)
    print(f"{len(results)} turns decoded by beamline ({args.device}, temperature {args.temperature}"
          f"{', Harmony constraint' if args.constrained else ''}) in {time.time() - started:.0f} s")
    summarize(results)
    ended = [r for r in results if r["valid"] or len(r["generated"]) < args.max_tokens]
    print(f"{'turns cut at --max-tokens (no stop token yet):':52s} {len(results) - len(ended)}")
    print(f"{'valid Harmony among the turns that ended:':52s} "
          f"{100.0 * sum(r['valid'] for r in ended) / max(1, len(ended)):.1f}% ({sum(r['valid'] for r in ended)}/{len(ended)})")
    passed, total = call_arguments_figure(results)
    print(f"{'calls whose arguments validate against the called tool:':52s} "
          f"{100.0 * passed / total if total else 0:.1f}% ({passed}/{total})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""`beamline generate --harmony-tools` on the shipped model (models/beam-nano): held-out turns of the tree's data
generator (20 conversations, seed 5) sampled at temperature 1.0 under the Harmony constraint with each turn's declared
tools. Every turn that ends (reaches a stop token before --max-tokens) is valid Harmony and every call's arguments
validate against the called tool's schema with its members in the schema's order (as serve holds them: the tools'
JSON is read in order); a turn cut at --max-tokens is a prefix of one; a bad --harmony-tools is an error naming the
option. Pure Python 3.

  python3 tools/train/check_generate_harmony_tools.py --beamline build/apps/beamline/beamline
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from eval_engine import call_arguments_figure, encode, evaluate, load_turns  # noqa: E402
from harmony_check import parse_completion  # noqa: E402


def out_of_order_calls(results):
    """Calls whose declared members do not come in the order of the tool's `properties`."""
    found = []
    for r in results:
        try:
            messages = parse_completion(r["completion"])
        except ValueError:
            continue
        order = {t["name"]: list((t["parameters"] or {}).get("properties", {})) for t in r["check"]["tools"]}
        for recipient, _, content, _ in messages:
            if recipient in order:
                keys = [k for k, _ in json.loads(content, object_pairs_hook=lambda pairs: pairs) if k in order[recipient]]
                if keys != sorted(keys, key=order[recipient].index):
                    found.append(f"{recipient}: {content}")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    args = parser.parse_args()
    model = os.path.join(ROOT, "models", "beam-nano")
    max_tokens = 300
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "data", "generate.py"), "--out", out, "--train", "0",
                        "--heldout", "20", "--seed", "5", "--workers", "1"], check=True, capture_output=True)
        turns = load_turns(os.path.join(out, "heldout.jsonl"), 20)
    encoded = encode(args.beamline, model, [prompt for _, prompt, _ in turns])
    results = evaluate(args.beamline, model, turns, encoded, max_tokens, "cpu", ["--temperature", "1.0"],
                       constrained=True, seed=100)
    ended = [r for r in results if r["valid"] or len(r["generated"]) < max_tokens]
    invalid = [r for r in ended if not r["valid"]]
    passed, calls = call_arguments_figure(results)
    print(f"{len(results)} turns, {len(ended)} ended, {len(invalid)} of those not valid Harmony; "
          f"{passed} of {calls} calls with valid arguments")
    failures = [f"not valid Harmony ({r.get('error', '')}): {r['completion'][-200:]!r}" for r in invalid]
    failures += [f"members out of the schema's order: {call}" for call in out_of_order_calls(results)]
    if passed != calls:
        failures.append(f"{calls - passed} calls whose arguments do not validate")
    if not ended:
        failures.append("no turn ended")
    bad = subprocess.run([args.beamline, "generate", "--model", model, "--tokens", "1,2,3", "--harmony-tools", "{"],
                         capture_output=True, text=True)
    if bad.returncode == 0 or "--harmony-tools: not JSON" not in bad.stdout + bad.stderr:
        failures.append(f"a bad --harmony-tools was not an error naming it: {bad.returncode} {bad.stdout[-300:]!r}")
    for failure in failures:
        print("FAIL", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Regenerates the golden logits in tests/data/golden from cases.json.

For each case: `beamline make-model` writes the random checkpoint (preset or config file, seed, dtype), then
beam_numpy.py (float64, independent of the C++ code) computes the logits of the case's tokens, saved as
tests/data/golden/<name>.npy. tests/model/test_golden.cpp rebuilds the same checkpoints with the same seeds
and compares beamline's logits against these files.

    /usr/bin/python3 tools/reference/make_golden.py --beamline build/apps/beamline/beamline
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "..", "tests", "data", "golden")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True, help="path of the beamline executable")
    parser.add_argument("--golden", default=GOLDEN, help="directory holding cases.json")
    args = parser.parse_args()
    with open(os.path.join(args.golden, "cases.json")) as f:
        cases = json.load(f)
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "model")
            command = [args.beamline, "make-model", "--out", model, "--seed", str(case["seed"]), "--dtype", case["dtype"]]
            if "preset" in case:
                command += ["--preset", case["preset"]]
            else:
                command += ["--config", os.path.join(args.golden, case["config"])]
            subprocess.run(command, check=True)
            out = os.path.join(args.golden, case["name"] + ".npy")
            tokens = ",".join(str(t) for t in case["tokens"])
            subprocess.run([sys.executable, os.path.join(HERE, "beam_numpy.py"), "--model", model, "--tokens", tokens,
                            "--out", out], check=True)
            print(f"{case['name']}: {out}")


if __name__ == "__main__":
    main()

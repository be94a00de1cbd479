#!/usr/bin/python3
"""Compares the C++ block drafter's logits (`beamline logits --drafter`) with the float64 NumPy reference
(drafter_numpy.py, written from DRAFTER_SEMANTICS.md) on a random tiny target and a random drafter.

  /usr/bin/python3 tools/reference/check_drafter_against_beamline.py --beamline build/apps/beamline/beamline
          [--target DIR --drafter DIR] [--tokens 40] [--anchors 0,1,9,39] [--seed 0] [--tolerance 1e-4]
          [--device cpu]

Without --target it writes make-model's `tiny` preset (BF16, random) and, without --drafter, a random drafter for it
with drafter_numpy.write_random_drafter (window 16, shorter than the sequence, so that the window is exercised; norms
drawn away from 1). For each anchor P the target runs over tokens[0..P-1] and the drafter drafts at P; the block
logits rows 1..B-1 are compared: max |a - b|, ||a - b|| / ||b|| and argmax agreement. Exits 1 when an anchor exceeds
the relative tolerance or an argmax differs where the reference's top two are more than 1e-3 apart.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import beam_numpy  # noqa: E402
import drafter_numpy  # noqa: E402
from beamline_server import make_tiny_model  # noqa: E402


def beamline_block_logits(beamline, target, drafter, tokens, anchor, device, out):
    subprocess.run([beamline, "logits", "--model", target, "--drafter", drafter, "--device", device, "--dtype",
                    "float32", "--tokens", ",".join(str(t) for t in tokens[:anchor + 1]), "--out", out],
                   check=True, stdout=subprocess.DEVNULL)
    return np.load(out).astype(np.float64)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--anchors", default="0,1,9,39")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="drafter-vs-beamline-")
    target = args.target
    if target is None:
        target = os.path.join(work, "target")
        make_tiny_model(args.beamline, target, args.seed)
    drafter = args.drafter
    if drafter is None:
        drafter = os.path.join(work, "drafter")
        c = beam_numpy.read_config(target)
        last = c["num_hidden_layers"] - 1
        drafter_numpy.write_random_drafter(target, drafter, args.seed, target_layer_ids=[0, last // 2, last],
                                           sliding_window=16, mask_token_id=c["vocab_size"] - 1)
    c = beam_numpy.read_config(target)
    t = beam_numpy.read_checkpoint(target)
    d = drafter_numpy.read_drafter_config(drafter, c)
    dt = beam_numpy.read_checkpoint(drafter)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, c["vocab_size"], size=args.tokens).tolist()
    failed = False
    for anchor in (int(v) for v in args.anchors.split(",")):
        reference = drafter_numpy.block_logits_loaded(c, t, d, dt, tokens, anchor)
        ours = beamline_block_logits(args.beamline, target, drafter, tokens, anchor, args.device,
                                     os.path.join(work, f"block-{anchor}.npy"))
        difference = np.abs(ours - reference)
        relative = np.linalg.norm(ours - reference) / np.linalg.norm(reference)
        top2 = np.sort(reference, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 1e-3
        disagree = int(np.sum((ours.argmax(1) != reference.argmax(1)) & clear))
        print(f"anchor {anchor:3d}: max |diff| {difference.max():.3e}, relative {relative:.3e}, "
              f"argmax differs in {disagree} of {int(clear.sum())} clear rows")
        failed |= relative > args.tolerance or disagree > 0
    if failed:
        sys.exit(f"the C++ drafter differs from drafter_numpy.py beyond {args.tolerance}")
    print("the C++ block drafter matches the NumPy reference")


if __name__ == "__main__":
    main()

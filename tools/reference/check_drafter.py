#!/usr/bin/env python3
"""Compares the block drafter's PyTorch forward (drafter_torch.py, FP32, all anchors of a sequence in one
block-sparse pass) with the float64 NumPy one (drafter_numpy.py, one anchor at a time).

  python3 tools/reference/check_drafter.py [--target models/beam-nano] [--drafter DIR] [--tokens 48]
          [--heldout-conversation I] [--anchors 0,1,7,40] [--seed 0] [--tolerance 1e-4] [--device cpu]

Without --drafter it writes a random drafter for the target (drafter_numpy.write_random_drafter) with a sliding
window of 16, shorter than the sequence, so that the window is exercised. Token ids are random, or with
--heldout-conversation I the rendering of held-out conversation I (generate.py's held-out split, seed 1 + 7777;
the target's tokenizer.json), where a trained drafter is confident; each anchor then also prints how many of
numpy's draft tokens match the text. Prints, per anchor, the max absolute difference and
||torch - numpy|| / ||numpy|| of the block logits and their argmax agreement; exits 1 when an anchor exceeds the
tolerance or disagrees on more than 1% of the argmaxes.
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import beam_numpy  # noqa: E402
import drafter_numpy  # noqa: E402
from beam_torch import load_checkpoint  # noqa: E402
from drafter_torch import draft, load_drafter  # noqa: E402


def heldout_tokens(target_dir, index):
    import random
    sys.path.insert(0, os.path.join(HERE, "..", "data"))
    sys.path.insert(0, os.path.join(HERE, "..", "tokenizer"))
    import generate
    from bpe import Tokenizer
    tokenizer = Tokenizer.load(os.path.join(target_dir, "tokenizer.json"))
    for split, seed, count in generate.split_jobs("heldout", index + 1, 1 + generate.HELDOUT_SEED_OFFSET):
        rng = random.Random(seed)
        for _ in range(count):
            example = generate.make_example(rng, split)
    return [token for text, _ in example["segments"] for token in tokenizer.encode(text)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=os.path.join(HERE, "..", "..", "models", "beam-nano"))
    parser.add_argument("--drafter")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--heldout-conversation", type=int, help="use this held-out conversation's tokens")
    parser.add_argument("--anchors", default="0,1,7,40")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    drafter_dir = args.drafter
    if drafter_dir is None:
        drafter_dir = os.path.join(tempfile.mkdtemp(prefix="drafter-check-"), "drafter")
        drafter_numpy.write_random_drafter(args.target, drafter_dir, args.seed, sliding_window=16)
    c = beam_numpy.read_config(args.target)
    t = beam_numpy.read_checkpoint(args.target)
    d = drafter_numpy.read_drafter_config(drafter_dir, c)
    dt = beam_numpy.read_checkpoint(drafter_dir)
    rng = np.random.default_rng(args.seed)
    if args.heldout_conversation is None:
        tokens = rng.integers(0, c["vocab_size"], size=args.tokens).tolist()
    else:
        tokens = heldout_tokens(args.target, args.heldout_conversation)
    anchors = [int(v) for v in args.anchors.split(",")]
    if max(anchors) >= len(tokens):
        sys.exit(f"--anchors: {max(anchors)} is not a position of the {len(tokens)} tokens")

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    target = load_checkpoint(args.target, args.device)
    drafter = load_drafter(drafter_dir, target.config, args.device)
    with torch.no_grad():
        from_torch = draft(target, drafter, torch.tensor([tokens], device=args.device),
                           torch.tensor([anchors], device=args.device))[0].double().cpu().numpy()
    source = "random" if args.heldout_conversation is None else f"held-out conversation {args.heldout_conversation}'s"
    print(f"target {args.target}, drafter {drafter_dir} ({d['num_hidden_layers']} layers, block "
          f"{d['dflash_config']['block_size']}, window {d['sliding_window']}), {len(tokens)} {source} tokens")
    ok = True
    for index, anchor in enumerate(anchors):
        ref = drafter_numpy.block_logits_loaded(c, t, d, dt, tokens, anchor)
        got = from_torch[index]
        diff = np.abs(got - ref).max()
        relative = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
        good = relative <= args.tolerance and agree >= 0.99
        ok &= good
        matched = ""
        if args.heldout_conversation is not None:
            following = tokens[anchor + 1:anchor + 1 + ref.shape[0]]
            run = 0
            while run < len(following) and ref[run].argmax() == following[run]:
                run += 1
            matched = f", the first {run} drafts match the text"
        print(f"anchor {anchor}: max |diff| {diff:.3e}, relative {relative:.3e}, argmax agreement "
              f"{100 * agree:.1f}% {'OK' if good else 'FAIL'}{matched}")
    print("drafter torch vs numpy:", "OK" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

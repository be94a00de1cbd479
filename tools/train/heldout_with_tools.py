#!/usr/bin/env python3
"""Writes a held-out set of an older checkout's data generator (e.g. beam-nano v1's, commit b083b3a, whose checks do not
carry the tools) with each turn's check given the conversation's declared tools ({"name", "parameters"}), as the tree's
generator writes them, for `eval_engine.py --constrained`. The conversations are the generator's own, byte for byte: the
tools are recorded as its Frame renders them. Pure Python 3.

  git worktree add --detach /tmp/beam-nano-v1 b083b3a
  python3 tools/train/heldout_with_tools.py /tmp/beam-nano-v1 --out DIR --train 0 --heldout 1000 --seed 1 --workers 1
"""
import sys

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit(__doc__)
sys.path.insert(0, sys.argv[1] + "/tools/data")
import generate  # noqa: E402  (the checkout's)

declared = []
plain_start, plain_make = generate.Frame.start, generate.make_example


def recording_start(self, rng, history=True):
    declared[:] = [{"name": t["name"], "parameters": t.get("parameters")} for t in self.tools]
    return plain_start(self, rng, history)


def make_with_tools(rng, split):
    declared.clear()
    example = plain_make(rng, split)
    for turn in example["turns"]:
        turn["check"]["tools"] = list(declared)
    return example


generate.Frame.start = recording_start
generate.make_example = make_with_tools
sys.argv = ["generate.py"] + sys.argv[2:]
generate.main()

#!/usr/bin/env python3
"""train.py's data path on the CPU: streamed training conversations (--stream-data) are the ones a full wait gives,
in the same order, and the streamed batches cover each exactly once; collate's LM-head targets are the positions
the reference's loss reads.

  PYTHONPATH=<dir with the regex module> /usr/bin/python3 tools/train/test_train_data.py
"""
import multiprocessing
import os
import random
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train  # noqa: E402

TOKENIZER = os.path.join(os.path.dirname(os.path.dirname(HERE)), "models", "beam-nano", "tokenizer.json")


def same(a, b):
    return len(a) == len(b) and all((x[0] == y[0]).all() and (x[1] == y[1]).all() for x, y in zip(a, b))


def main():
    failures = 0
    with multiprocessing.Pool(2, initializer=train._worker_init, initargs=(TOKENIZER,)) as pool:
        streamed = train.TrainData(pool, 2500, 1, stream=True)
        rng = random.Random(1)
        plans = [train.batches(streamed.examples, 3000, rng, streamed.take())]
        while not streamed.complete:
            time.sleep(0.5)
            plans.append(train.batches(streamed.examples, 3000, rng, streamed.take()))
        covered = sorted(i for plan in plans for batch in plan for i in batch)
        once = covered == list(range(len(streamed.examples)))
        waited = train.TrainData(pool, 2500, 1, stream=False)
        waited.take()
        equal = waited.complete and same(streamed.examples, waited.examples)
    print(f"streamed in {len(plans)} takes: each conversation in one batch {'ok' if once else 'FAILED'}; "
          f"the same conversations as waiting for all {'ok' if equal else 'FAILED'}")
    failures += not (once and equal)

    indices = train.batches(streamed.examples, 3000, random.Random(2))[0]
    tokens, loss_mask, valid, targets = train.collate(streamed.examples, indices, "cpu")
    B, T = tokens.shape
    expected = torch.arange(B * T).view(B, T)[:, :-1][loss_mask[:, 1:]]
    right = torch.equal(targets, expected) and bool((valid.sum(1) == torch.tensor(
        [len(streamed.examples[i][0]) for i in indices])).all())
    print(f"collate: {B} rows of {T}, {len(targets)} targets: {'ok' if right else 'FAILED'}")
    failures += not right
    print("FAILED" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

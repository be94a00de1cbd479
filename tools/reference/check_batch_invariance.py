#!/usr/bin/env python3
"""Batch invariance (`beamline serve --batch-invariant`): one temperature-0 prompt gives bit-identical tokens and
logprobs whatever else shares its steps.

  python3 tools/reference/check_batch_invariance.py [--beamline build/apps/beamline/beamline] [--device cpu]
          [--completions 8] [--model DIR] [--extra-args "..."]

Asks for the prompt alone first (batch 1), then --completions more times among other requests of random lengths
(sampled at temperature 1) that a few threads keep in flight, each sent at a random moment, so that the prompt lands
at different places of different batches, its prefill split into different chunks (small --max-num-batched-tokens):
every other copy of it carries a cache_salt of its own and computes its prompt, the rest read it from the prefix cache.
Every answer's token ids and logprobs (the chosen token's and the top 5) must equal the first answer's exactly (JSON
numbers carry float32 values exactly). Prints how many distinct answers it saw; exits 1 when more than one.
bench/batch_invariance_serve.py runs the same load at 1,000 completions, with the mode and without.
"""
import concurrent.futures
import json
import os
import random
import shlex
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from beamline_server import Server, check_parser, make_tiny_model, post  # noqa: E402


def invariance_answers(server, name, prompt, completions, seed, max_tokens=16, workers=8, vocab=400):
    """(the answer alone, the `completions` answers under load) of `prompt` at temperature 0 on `server`, each a JSON
    string of its token ids and logprobs. The load: 1 to 6 other requests per copy (random prompts of 3-60 ids below
    `vocab`, 1-24 tokens at temperature 1), all of them and the copies sent in a random order by `workers` threads, each
    after a random pause of up to 20 ms."""
    rng = random.Random(seed)
    target = {"model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 5,
              "ignore_eos": True, "return_token_ids": True}

    def answer(body):
        status, response = post(server.base, "/v1/completions", body)
        assert status == 200, response
        choice = response["choices"][0]
        return json.dumps({"ids": choice["token_ids"], "logprobs": choice["logprobs"]}, sort_keys=True)

    alone = answer(target)
    # (pause, body, is a copy of the target), drawn here so that a seed gives one load whatever the threads do.
    tasks = []
    for copy in range(completions):
        group = [(rng.random() * 0.02, {**target, "cache_salt": f"copy-{copy}"} if copy % 2 else target, True)]
        for _ in range(rng.randrange(1, 7)):
            length = rng.randrange(3, 60)
            group.append((rng.random() * 0.02,
                          {"model": name, "prompt": [rng.randrange(0, vocab) for _ in range(length)],
                           "max_tokens": rng.randrange(1, 24), "temperature": 1.0, "ignore_eos": True,
                           "return_token_ids": True}, False))
        rng.shuffle(group)
        tasks += group

    def run(task):
        pause, body, _ = task
        time.sleep(pause)
        return answer(body)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(run, tasks))
    return alone, [result for result, task in zip(results, tasks) if task[2]]


def main():
    parser = check_parser(__doc__)
    parser.add_argument("--model")
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--extra-args", default="--batch-invariant --max-num-batched-tokens 32 --max-num-seqs 8",
                        help="`beamline serve` flags")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = os.path.join(scratch, "tiny")
            make_tiny_model(args.beamline, model, args.seed)
        name = os.path.basename(os.path.normpath(model))
        prompt = [rng.randrange(0, 400) for _ in range(23)]
        server = Server(args.beamline, model, args.device, shlex.split(args.extra_args))
        try:
            alone, answers = invariance_answers(server, name, prompt, args.completions, args.seed, args.max_tokens)
        finally:
            server.stop()
        distinct = len(set([alone] + answers))
        print(f"{len(answers) + 1} temperature-0 answers of one prompt under different loads: {distinct} distinct "
              f"(serve {args.extra_args})")
        if distinct != 1:
            sys.exit(1)


if __name__ == "__main__":
    main()

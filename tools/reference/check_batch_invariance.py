#!/usr/bin/env python3
"""Batch invariance (`beamline serve --batch-invariant`): one temperature-0 prompt gives bit-identical tokens and
logprobs whatever else shares its steps.

  python3 tools/reference/check_batch_invariance.py [--beamline build/apps/beamline/beamline] [--device cpu]
          [--rounds 8] [--model DIR] [--extra-args "..."]

Asks for the prompt alone first, then in --rounds rounds together with 1..6 other requests of random lengths
(sampled at temperature 1), sent at random moments so that the prompt lands at different places of different batches,
its prefill split into different chunks (small --max-num-batched-tokens) or read from the prefix cache. Every answer's
token ids and logprobs (the chosen token's and the top 5) must equal the first answer's exactly (JSON numbers carry
float32 values exactly). Prints how many distinct answers it saw; exits 1 when more than one.
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


def main():
    parser = check_parser(__doc__)
    parser.add_argument("--model")
    parser.add_argument("--rounds", type=int, default=8)
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
        target = {"model": name, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "logprobs": 5,
                  "ignore_eos": True, "return_token_ids": True}

        def answer(body):
            status, response = post(server.base, "/v1/completions", body)
            assert status == 200, response
            choice = response["choices"][0]
            return json.dumps({"ids": choice["token_ids"], "logprobs": choice["logprobs"]}, sort_keys=True)

        def other():
            time.sleep(rng.random() * 0.05)
            length = rng.randrange(3, 60)
            return answer({"model": name, "prompt": [rng.randrange(0, 400) for _ in range(length)],
                           "max_tokens": rng.randrange(1, 24), "temperature": 1.0, "ignore_eos": True,
                           "return_token_ids": True})

        def delayed_target():
            time.sleep(rng.random() * 0.05)
            return answer(target)

        server = Server(args.beamline, model, args.device, shlex.split(args.extra_args))
        try:
            answers = [answer(target)]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                for _ in range(args.rounds):
                    others = [pool.submit(other) for _ in range(rng.randrange(1, 7))]
                    answers.append(pool.submit(delayed_target).result())
                    for future in others:
                        future.result()
        finally:
            server.stop()
        distinct = len(set(answers))
        print(f"{len(answers)} temperature-0 answers of one prompt under different loads: {distinct} distinct "
              f"(serve {args.extra_args})")
        if distinct != 1:
            sys.exit(1)


if __name__ == "__main__":
    main()

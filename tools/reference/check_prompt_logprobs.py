#!/usr/bin/env python3
"""prompt_logprobs against the NumPy reference: what `beamline serve` returns for every prompt token equals
beam_numpy.py's log-softmax (or, with --logprobs-mode raw_logits, its logits) of the position before it.

  python3 tools/reference/check_prompt_logprobs.py [--beamline build/apps/beamline/beamline] [--device cpu]

A random tiny checkpoint; prompts are split into chunks (small --max-num-batched-tokens). Checks, for vLLM's shape
([null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]): the first entry null; each entry holds the prompt token
with the reference's value (within --tolerance) and k alternatives that are the reference's k best (within the
tolerance); the same prompt sent after it was cached is computed again (cached_tokens 0) and gives the same values
bit for bit; raw_logits mode gives logits. prompt_logprobs on /v1/chat/completions is a 400 naming it.
"""
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import beam_numpy  # noqa: E402
from beamline_server import Server, check_parser, make_tiny_model, post  # noqa: E402


def log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def check(what, entries, prompt, reference, k, tolerance):
    if len(entries) != len(prompt) or entries[0] is not None:
        sys.exit(f"{what}: {len(entries)} entries for {len(prompt)} prompt tokens (the first must be null)")
    for p in range(1, len(prompt)):
        entry = {int(token): value for token, value in entries[p].items()}
        expected = reference[p - 1]
        token = prompt[p]
        if token not in entry or abs(entry[token]["logprob"] - expected[token]) > tolerance:
            sys.exit(f"{what}: prompt token {p} (id {token}): {entry.get(token)}, the reference has {expected[token]}")
        alternatives = sorted((item for item in entry.items() if item[1]["rank"] <= k), key=lambda i: i[1]["rank"])
        if len(alternatives) != k:
            sys.exit(f"{what}: prompt token {p}: {len(alternatives)} alternatives, {k} asked")
        kth_best = np.sort(expected)[::-1][k - 1]
        for token_id, value in alternatives:
            if abs(value["logprob"] - expected[token_id]) > tolerance or expected[token_id] < kth_best - tolerance:
                sys.exit(f"{what}: prompt token {p}: alternative {token_id} {value}, the reference has "
                         f"{expected[token_id]} (its k-th best {kth_best})")


def main():
    parser = check_parser(__doc__)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = os.path.join(scratch, "tiny")
        make_tiny_model(args.beamline, model, args.seed)
        config = beam_numpy.read_config(model)
        rng = np.random.default_rng(args.seed)
        prompt = [int(v) for v in rng.integers(0, config["vocab_size"] - 32, 37)]
        logits = beam_numpy.forward(config, beam_numpy.read_checkpoint(model), prompt)
        k = 3
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, "prompt_logprobs": k}

        server = Server(args.beamline, model, args.device, ["--max-num-batched-tokens", "16", "--max-num-seqs", "8"])
        try:
            status, first = post(server.base, "/v1/completions", body)
            assert status == 200, first
            check("prompt_logprobs", first["choices"][0]["prompt_logprobs"], prompt, log_softmax(logits), k,
                  args.tolerance)
            # Cached by a request without prompt_logprobs, then asked again: computed, not read from the cache.
            status, plain = post(server.base, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1})
            assert status == 200, plain
            status, again = post(server.base, "/v1/completions", body)
            assert status == 200, again
            if again["usage"]["prompt_tokens_details"]["cached_tokens"] != 0:
                sys.exit(f"prompt_logprobs read a cached prompt: {again['usage']}")
            if again["choices"][0]["prompt_logprobs"] != first["choices"][0]["prompt_logprobs"]:
                sys.exit("prompt_logprobs differ between two computations of the same prompt")
            status, chat = post(server.base, "/v1/chat/completions",
                                {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                 "prompt_logprobs": 1})
            assert status == 400 and chat["error"]["param"] == "prompt_logprobs", (status, chat)
        finally:
            server.stop()

        server = Server(args.beamline, model, args.device, ["--logprobs-mode", "raw_logits"])
        try:
            status, raw = post(server.base, "/v1/completions", body)
            assert status == 200, raw
            check("prompt_logprobs (raw_logits)", raw["choices"][0]["prompt_logprobs"], prompt, logits, k,
                  args.tolerance)
        finally:
            server.stop()
        print(f"prompt_logprobs equal the reference's over {len(prompt) - 1} prompt tokens (top-{k}, tolerance "
              f"{args.tolerance}), in raw_logprobs and raw_logits; recomputed, not cached, the second time")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Routing replay against the NumPy reference: the experts `beamline serve --enable-return-routed-experts` returns
for every prompt and output token equal beam_numpy.py's routing of the same tokens, at every token and MoE layer.

  python3 tools/reference/check_routed_experts.py [--beamline build/apps/beamline/beamline] [--model DIR]
          [--device cpu] [--seed 5] [--extra-args "..."]

Without --model it writes a random tiny checkpoint (`beamline make-model --preset tiny`). The server runs with a
small --max-num-batched-tokens so that prompts are split into chunks and share steps with other sequences' decodes,
and a few requests run at once: /generate (SGLang's meta_info.routed_experts, a batch of prompts, n = 2) and
/v1/completions (a batch of prompts; and streamed: the chunks' rows concatenated). Each answer's routing must have
prompt + output - 1 rows (the last output token is never computed) of [moe_layers, top_k] ids, equal to the
reference's, which computes the whole token sequence at once in float64 with the router in float32.
A request without the field gets none; return_routed_experts on a server without the flag is a 400 naming it. With
--data-parallel-size in --extra-args, every replica's engine must have served some of the requests.
Exits 1 on the first difference, naming request, token and layer.
"""
import base64
import concurrent.futures
import os
import shlex
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import beam_numpy  # noqa: E402
from beamline_server import Server, check_parser, finished_by_engine, make_tiny_model, post  # noqa: E402


def decode(field, layers, top_k):
    raw = base64.b64decode(field) if field else b""
    return np.frombuffer(raw, dtype="<i2").astype(np.int64).reshape(-1, layers, top_k)



def main():
    parser = check_parser(__doc__)
    parser.add_argument("--model")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--extra-args", default="", help="more `beamline serve` flags")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = os.path.join(scratch, "tiny")
            make_tiny_model(args.beamline, model, args.seed)
        config = beam_numpy.read_config(model)
        weights = beam_numpy.read_checkpoint(model)
        layers = config["num_hidden_layers"] - config["first_k_dense_replace"]
        top_k = config["num_experts_per_tok"]
        vocab = config["vocab_size"]
        rng = np.random.default_rng(args.seed)

        def prompt(length):
            return [int(v) for v in rng.integers(0, vocab - 32, length)]  # below the Harmony specials

        # (what, prompt ids, output ids, routing field) of every answer
        answers = []
        server = Server(args.beamline, model, args.device,
                        ["--enable-return-routed-experts", "--max-num-batched-tokens", "24", "--max-num-seqs", "8", "--seed", "0"]
                        + shlex.split(args.extra_args))
        try:
            prompts = [prompt(n) for n in (5, 29, 40, 11)]
            sampling = {"max_new_tokens": 9, "temperature": 1.0, "n": 2, "ignore_eos": True}

            def generate():
                status, body = post(server.base, "/generate", {"input_ids": prompts[:2], "sampling_params": sampling,
                                                               "return_routed_experts": True})
                assert status == 200, body
                return [("/generate", prompts[i // 2], a["output_ids"], a["meta_info"]["routed_experts"])
                        for i, a in enumerate(body)]

            def completion_stream():
                status, events = post(server.base, "/v1/completions",
                                      {"model": os.path.basename(model), "prompt": prompts[2], "max_tokens": 12,
                                       "temperature": 0, "stream": True, "return_token_ids": True,
                                       "return_routed_experts": True}, stream=True)
                assert status == 200, events
                ids, rows = [], b""
                for event in events:
                    for choice in event["choices"]:
                        ids += choice["token_ids"]
                        rows += base64.b64decode(choice["routed_experts"])
                return [("/v1/completions stream", prompts[2], ids, base64.b64encode(rows).decode())]

            def completion():
                status, body = post(server.base, "/v1/completions",
                                    {"model": os.path.basename(model), "prompt": [prompts[3], prompts[0]],
                                     "max_tokens": 7, "temperature": 0.8, "seed": 3, "return_token_ids": True,
                                     "return_routed_experts": True})
                assert status == 200, body
                return [("/v1/completions", c["prompt_token_ids"], c["token_ids"], c["routed_experts"])
                        for c in body["choices"]]

            def plain():
                status, body = post(server.base, "/v1/completions",
                                    {"model": os.path.basename(model), "prompt": prompts[1], "max_tokens": 5,
                                     "return_token_ids": True})
                assert status == 200 and "routed_experts" not in body["choices"][0], body
                return []

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                for result in pool.map(lambda f: f(), [generate, completion_stream, completion, plain]):
                    answers += result
            if "--data-parallel-size" in args.extra_args:
                # at least one engine request per prompt: /generate's 2, the stream, the batch of 2, the plain one
                engines = finished_by_engine(server.base, 6)
                if len([e for e, n in engines.items() if n > 0]) < 2:
                    sys.exit(f"the requests did not reach every data-parallel replica: finished by engine {engines}")
                print(f"finished by engine: {engines}")
        finally:
            server.stop()

        plain_server = Server(args.beamline, model, args.device, shlex.split(args.extra_args))
        try:
            status, body = post(plain_server.base, "/generate",
                                {"input_ids": prompt(4), "return_routed_experts": True})
            assert status == 400 and body["error"]["param"] == "return_routed_experts", (status, body)
        finally:
            plain_server.stop()

        checked = 0
        for what, prompt_ids, output_ids, field in answers:
            tokens = list(prompt_ids) + list(output_ids)
            got = decode(field, layers, top_k)
            if got.shape[0] != len(tokens) - 1:
                sys.exit(f"{what}: {got.shape[0]} rows of routing for {len(prompt_ids)} prompt and {len(output_ids)} "
                         f"output tokens (expected {len(tokens) - 1})")
            routing = []
            beam_numpy.forward(config, weights, tokens[:-1], routing=routing)
            expected = np.stack(routing, axis=1)  # [tokens, layers, top_k]
            wrong = np.argwhere(got != expected)
            if wrong.size:
                token, layer, _ = wrong[0]
                sys.exit(f"{what}: token {token} (of {len(tokens) - 1}), MoE layer {layer}: experts "
                         f"{got[token, layer].tolist()}, the reference routes to {expected[token, layer].tolist()} "
                         f"({len(wrong)} ids differ)")
            checked += got.shape[0]
        print(f"routed experts equal the reference: {len(answers)} answers, {checked} tokens x {layers} MoE layers x "
              f"top-{top_k}")


if __name__ == "__main__":
    main()

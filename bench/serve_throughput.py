#!/usr/bin/env python3
"""Prefill and decode throughput of `beamline serve` per batch size, next to the weight-bytes floor.

Serves a model directory (made with `beamline make-model --no-weights`) with `--load-format dummy` on the GPU, then
for each batch size B sends B concurrent /v1/completions requests of P random prompt token ids, twice: with
max_tokens 1 (the prefill, plus one step) and with max_tokens 1 + D (ignore_eos). Prefill throughput is B*P over the
first run's wall time; decode throughput is B*D over the difference of the two. Prints a Markdown table.

Usage: python3 bench/serve_throughput.py BINARY MODEL_DIR [--batches 1,16,64] [--prompt 8192] [--decode 64]
                                         [--hf-overrides JSON] [--floor-bytes N] [--serve-args '--enforce-eager ...']
"""
import argparse
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

PORT = 8123


def post(body):
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.load(response)


def run_batch(batch, prompt_length, max_tokens, vocab, seed, name):
    rng = random.Random(seed)
    bodies = [{"model": name, "prompt": [rng.randrange(vocab) for _ in range(prompt_length)], "max_tokens": max_tokens,
               "temperature": 0, "ignore_eos": True} for _ in range(batch)]
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(post, bodies))
    elapsed = time.time() - start
    produced = sum(r["usage"]["completion_tokens"] for r in results)
    return elapsed, produced


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary")
    parser.add_argument("model")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt", type=int, default=8192)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--hf-overrides", default="")
    parser.add_argument("--floor-bytes", type=float, default=0.0, help="bytes one decode step must read at batch 1")
    parser.add_argument("--serve-args", default="", help="more flags for beamline serve, space-separated")
    args = parser.parse_args()
    vocab = json.load(open(f"{args.model}/config.json"))["vocab_size"]
    name = os.path.basename(os.path.normpath(args.model))  # the served model name
    batches = [int(b) for b in args.batches.split(",")]
    command = [args.binary, "serve", "--model", args.model, "--load-format", "dummy", "--device", "cuda",
               "--port", str(PORT), "--gpu-memory-utilization", "0.95", "--max-num-seqs", str(max(batches)),
               "--max-model-len", str(args.prompt + args.decode + 16), "--max-num-batched-tokens", "8192"]
    if args.hf_overrides:
        command += ["--hf-overrides", args.hf_overrides]
    command += args.serve_args.split()
    server = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr)
    try:
        deadline = time.time() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    sys.exit("serve_throughput: the server did not start")
                time.sleep(1)
        run_batch(1, 64, 4, vocab, 0, name)  # warm-up: allocator caches, cuBLAS plans
        floor_ms = args.floor_bytes / 4.8e12 * 1e3
        print(f"\n`{' '.join(command[1:])}`; prompt {args.prompt} tokens, decode {args.decode} tokens, greedy\n")
        print("| batch | prefill s | prefill tokens/s | decode tokens/s | ms per decode step | step floor ms (weights, batch 1) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for batch in batches:
            prefill_s, _ = run_batch(batch, args.prompt, 1, vocab, batch, name)
            total_s, produced = run_batch(batch, args.prompt, 1 + args.decode, vocab, batch + 1000, name)
            decode_s = max(total_s - prefill_s, 1e-9)
            step_ms = decode_s / args.decode * 1e3
            print(f"| {batch} | {prefill_s:.2f} | {batch * args.prompt / prefill_s:.0f} | "
                  f"{batch * args.decode / decode_s:.0f} | {step_ms:.2f} | {floor_ms:.2f} |", flush=True)
            assert produced == batch * (1 + args.decode), f"expected {batch * (1 + args.decode)} tokens, got {produced}"
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()

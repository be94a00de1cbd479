#!/usr/bin/env python3
"""Prefill and decode throughput of `beamline serve` per batch size, next to the weight-bytes floor.

Serves a model directory (made with `beamline make-model --no-weights`) with `--load-format dummy` on the GPU, then
for each batch size B sends B concurrent /v1/completions requests of P random prompt token ids, twice: with
max_tokens 1 (the prefill, plus one step) and streamed with max_tokens 1 + D (ignore_eos). Prefill throughput is B*P
over the first run's wall time. A decode step is timed from the streamed chunks alone, in the window where every
request decodes (after the last prefill, before the first request ends), so that neither prefill steps nor chunked
prompt work mixed into decode steps enter it (run_streamed). Prints a Markdown table.

Usage: python3 bench/serve_throughput.py BINARY MODEL_DIR [--batches 1,16,64] [--prompt 8192] [--decode 64]
                                         [--hf-overrides JSON] [--floor-bytes N] [--serve-args '--enforce-eager ...']
"""
import argparse
import concurrent.futures
import json
import os
import random
import signal
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


# Streams one completion; returns (tokens, the arrival time of each chunk that carries a token).
def post_streamed(body):
    body = dict(body, stream=True, stream_options={"include_usage": True})
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    times = []
    tokens = 0
    with urllib.request.urlopen(request, timeout=1800) as response:
        for line in response:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: "):])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices"):
                times.append(time.time())
    return tokens, times


def bodies_for(batch, prompt_length, max_tokens, vocab, seed, name):
    rng = random.Random(seed)
    return [{"model": name, "prompt": [rng.randrange(vocab) for _ in range(prompt_length)], "max_tokens": max_tokens,
             "temperature": 0, "ignore_eos": True} for _ in range(batch)]


def run_batch(batch, prompt_length, max_tokens, vocab, seed, name):
    bodies = bodies_for(batch, prompt_length, max_tokens, vocab, seed, name)
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(post, bodies))
    elapsed = time.time() - start
    produced = sum(r["usage"]["completion_tokens"] for r in results)
    return elapsed, produced


# The time of one decode step of the whole batch, and the tokens. Only the window in which every request decodes
# counts: from the last request's first token (every prefill is done, so no step carries a prompt chunk) to the
# first request's last token (no request has left). Each request's chunks in that window give its steps per second;
# the median over the batch is taken (a chunk arrives a little after its step, the same delay at both ends).
def run_streamed(batch, prompt_length, max_tokens, vocab, seed, name):
    bodies = bodies_for(batch, prompt_length, max_tokens, vocab, seed, name)
    with concurrent.futures.ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(post_streamed, bodies))
    start = max(times[0] for _, times in results)
    end = min(times[-1] for _, times in results)
    # Requests that arrive late (client threads) can leave a window too short to time; a quarter of the decode steps
    # is the least that counts.
    least_steps = max(2, (max_tokens - 1) // 4)
    per_step = []
    for _, times in results:
        inside = [t for t in times if start <= t <= end]
        if len(inside) - 1 >= least_steps:
            per_step.append((inside[-1] - inside[0]) / (len(inside) - 1))
    assert per_step, f"fewer than {least_steps} steps in which every request decodes: raise --decode"
    per_step.sort()
    return per_step[len(per_step) // 2], sum(tokens for tokens, _ in results)


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
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check of this script")
    args = parser.parse_args()
    vocab = json.load(open(f"{args.model}/config.json"))["vocab_size"]
    name = os.path.basename(os.path.normpath(args.model))  # the served model name
    batches = [int(b) for b in args.batches.split(",")]
    # The streamed run decodes D tokens more than the steps that still carry other requests' prompt chunks, so
    # that D steps of the window in which every request decodes remain (run_streamed).
    step_tokens = 8192
    prefill_steps = {batch: -(-batch * args.prompt // step_tokens) for batch in batches}
    command = [args.binary, "serve", "--model", args.model, "--load-format", "dummy", "--device", args.device,
               "--port", str(PORT), "--gpu-memory-utilization", "0.95", "--max-num-seqs", str(max(batches)),
               "--max-model-len", str(args.prompt + args.decode + max(prefill_steps.values()) + 16),
               "--max-num-batched-tokens", str(step_tokens)]
    if args.hf_overrides:
        command += ["--hf-overrides", args.hf_overrides]
    command += args.serve_args.split()
    server = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr)
    # A SIGTERM (a caller's timeout) ends this script through the finally below, so that the server goes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("serve_throughput: terminated"))
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
        print(f"\n`{' '.join(command[1:])}`; prompt {args.prompt} tokens, greedy; decode {args.decode} tokens plus one "
              f"per step that carries a prompt chunk, timed where every request decodes\n")
        print("| batch | prefill s | prefill tokens/s | decode tokens/s | ms per decode step | step floor ms (weights, batch 1) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for batch in batches:
            prefill_s, _ = run_batch(batch, args.prompt, 1, vocab, batch, name)
            decode = args.decode + prefill_steps[batch]
            step_s, produced = run_streamed(batch, args.prompt, 1 + decode, vocab, batch + 1000, name)
            step_ms = step_s * 1e3
            print(f"| {batch} | {prefill_s:.2f} | {batch * args.prompt / prefill_s:.0f} | "
                  f"{batch / step_s:.0f} | {step_ms:.2f} | {floor_ms:.2f} |", flush=True)
            assert produced == batch * (1 + decode), f"expected {batch * (1 + decode)} tokens, got {produced}"
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""One long prompt per length through `beamline serve`: TTFT, prefill tokens/s, the decode step at that context next
to its floor, and the KV memory the engine holds against runner/kv_cache.h's prediction (docs/long-context.md).

Serves a model directory (make-model --no-weights) with --load-format dummy, then for each length L sends one streamed
/v1/completions request of L - D random prompt token ids and max_tokens D (ignore_eos), so that the sequence reaches
L - 1 positions: prompt + output = L, at most --max-model-len. The lengths run in the order given, one server for
all, and each prints its Markdown row as soon as it is done, so a failure at the last length still leaves the
earlier rows.

  TTFT         from sending the request (its JSON body included) to the first token's chunk;
  prefill      (L - D) / TTFT;
  decode step  the median gap between token chunks after the first;
  floor        bytes one decode step must read at 4.8 TB/s: the weights of one token's path (attention, dense,
               router, the routed experts it uses, the LM head; --quantization's bytes, scales included) plus the
               KV the step reads (the full-attention layers' L positions, the sliding layers' windows);
  KV           vllm:kv_cache_usage_perc polled from /metrics while the request decodes (its largest value) times the
               pool's blocks and block bytes (from the server log), against the prediction that
               `beamline make-model --dry-run --kv-tokens N` prints for the first and the last decoded position.

Usage: python3 bench/long_context.py BINARY MODEL_DIR --lengths 131072,1048576 [--decode 128] [--chunk 16384]
       [--kv-cache-memory 6G] [--quantization fp8] [--kv-cache-dtype fp8] [--device cuda] [--serve-args '...']
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PORT = 8124
BANDWIDTH = 4.8e12  # bytes/s, the H200's HBM


def url(path):
    return f"http://127.0.0.1:{PORT}{path}"


def kv_usage():
    with urllib.request.urlopen(url("/metrics"), timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("vllm:kv_cache_usage_perc"):
                return float(line.split()[-1])
    return None


# Polls the KV usage while `running` is set; keeps the largest value.
class UsagePoller(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.running = threading.Event()
        self.stop = threading.Event()
        self.largest = 0.0

    def run(self):
        while not self.stop.is_set():
            if self.running.is_set():
                value = kv_usage()
                if value is not None:
                    self.largest = max(self.largest, value)
            time.sleep(0.02)


# Streams one completion; returns the send time and the arrival time of each chunk that carries a token.
def stream(body, poller):
    body = dict(body, stream=True, stream_options={"include_usage": True})
    data = json.dumps(body).encode()
    request = urllib.request.Request(url("/v1/completions"), data=data, headers={"Content-Type": "application/json"})
    times, tokens = [], 0
    sent = time.time()
    with urllib.request.urlopen(request, timeout=3600) as response:
        for line in response:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: "):])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices"):
                times.append(time.time())
                # From the third token on every step decodes: the usage no longer shows the last prefill step's
                # sliding blocks (a window plus a chunk per sliding group).
                if len(times) == 3:
                    poller.running.set()
    poller.running.clear()
    return sent, times, tokens, len(data)


# make-model --dry-run's totals and KV prediction for N tokens (runner/kv_cache.h's predict_kv_memory).
def dry_run(binary, model, quantization, tokens):
    command = [binary, "make-model", "--config", f"{model}/config.json", "--dry-run", "--kv-tokens", str(tokens)]
    if quantization:
        command += ["--quantization", quantization]
    text = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    prediction = {}
    for line in text.splitlines():
        found = re.match(r"kv (\S+): (\d+) bytes per token .*?, (\d+) bytes for the window .*?; (\d+) tokens: (\d+) "
                         r"bytes, (\d+) blocks of (\d+) bytes held while decoding", line)
        if found:
            dtype = found.group(1)
            prediction[dtype] = {"bytes_per_token": int(found.group(2)), "sliding_bytes": int(found.group(3)),
                                 "bytes": int(found.group(5)), "blocks": int(found.group(6)),
                                 "block_bytes": int(found.group(7))}
    return text, prediction


# Bytes of one token's path through the weights, from the dry run's tensor list: every tensor but the embedding
# table (one row read), the routed experts (num_experts_per_tok of n_routed_experts per MoE layer) and the lm_head
# counted whole.
def weight_bytes_per_token(dry_run_text, config):
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1, "F8_E8M0": 1}
    total = 0.0
    share = config["num_experts_per_tok"] / config["n_routed_experts"]
    for line in dry_run_text.splitlines():
        parts = line.split(" ", 2)  # name dtype [d0, d1, ...]
        if len(parts) != 3 or parts[1] not in sizes or not parts[2].startswith("["):
            continue
        numel = 1
        for dim in parts[2].strip("[]").split(","):
            if dim.strip():
                numel *= int(dim)
        nbytes = numel * sizes[parts[1]]
        if parts[0] == "model.embed_tokens.weight":
            nbytes /= config["vocab_size"]
        elif ".mlp.experts." in parts[0]:
            nbytes *= share
        total += nbytes
    return total


def server_pool(log_path):
    text = open(log_path, errors="replace").read()
    found = re.search(r"KV budget [\d.]+ MiB: (\d+) blocks of (\d+) tokens x (\d+) layer slots \((\d+) bytes each", text)
    if not found:
        sys.exit("long_context: the server log names no KV budget line")
    return int(found.group(1)), int(found.group(4))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary")
    parser.add_argument("model")
    parser.add_argument("--lengths", default="131072,1048576", help="prompt + output tokens per request, in order")
    parser.add_argument("--decode", type=int, default=128, help="output tokens per request")
    parser.add_argument("--chunk", type=int, default=16384, help="--max-num-batched-tokens: the prefill chunk")
    parser.add_argument("--kv-cache-memory", default="6G")
    parser.add_argument("--quantization", default="fp8")
    parser.add_argument("--kv-cache-dtype", default="fp8")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run of this script")
    parser.add_argument("--log", default="long_context_server.log", help="the server's output")
    parser.add_argument("--serve-args", default="", help="more flags for beamline serve, space-separated")
    args = parser.parse_args()
    config = json.load(open(f"{args.model}/config.json"))
    lengths = [int(length) for length in args.lengths.split(",")]
    name = os.path.basename(os.path.normpath(args.model))
    kv_name = {"fp8": "fp8", "bfloat16": "bfloat16", "auto": "bfloat16"}[args.kv_cache_dtype]

    command = [args.binary, "serve", "--model", args.model, "--load-format", "dummy", "--device", args.device,
               "--port", str(PORT), "--max-num-seqs", "1", "--max-model-len", str(max(lengths)),
               "--max-num-batched-tokens", str(args.chunk), "--kv-cache-dtype", args.kv_cache_dtype,
               "--kv-cache-memory", args.kv_cache_memory, "--no-enable-prefix-caching"]
    if args.quantization:
        command += ["--quantization", args.quantization]
    command += args.serve_args.split()
    # A step's time limit (bench/gpu_steps.sh) ends this script with SIGTERM: stop the server on the way out too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("long_context: terminated"))
    log = open(args.log, "w")
    started = time.time()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    poller = UsagePoller()
    poller.start()
    try:
        while True:
            try:
                with urllib.request.urlopen(url("/health"), timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.time() - started > 600:
                    sys.exit(f"long_context: the server did not start (see {args.log})")
                time.sleep(1)
        print(f"server up in {time.time() - started:.0f} s: `{' '.join(command[1:])}`", flush=True)
        blocks, block_bytes = server_pool(args.log)
        print(f"KV pool: {blocks} blocks of {block_bytes} bytes ({blocks * block_bytes / 2**30:.2f} GiB)\n")
        print("| context | prompt | TTFT s | prefill tokens/s | decode step ms (median) | floor ms (weights + KV) "
              "| KV held (blocks, GiB) | predicted (blocks, GiB) | KV per token |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
        rng = random.Random(0)
        for length in lengths:
            prompt = length - args.decode
            text, first = dry_run(args.binary, args.model, args.quantization, prompt)
            _, last = dry_run(args.binary, args.model, args.quantization, length - 2)
            weights = weight_bytes_per_token(text, config)
            # Ordinary token ids: the synthetic tokenizer's special tokens lie at the top of the vocabulary.
            vocab = config["vocab_size"]
            body = {"model": name, "prompt": [rng.randrange(vocab // 8, vocab // 2) for _ in range(prompt)],
                    "max_tokens": args.decode, "temperature": 0, "ignore_eos": True}
            poller.largest = 0.0
            sent, times, tokens, body_bytes = stream(body, poller)
            assert tokens == args.decode and len(times) >= 2, f"expected {args.decode} tokens, got {tokens}"
            ttft = times[0] - sent
            step = statistics.median(b - a for a, b in zip(times, times[1:]))
            p_first, p_last = first[kv_name], last[kv_name]
            # The decode steps read the KV of about `length` positions: the last one's prediction.
            floor = (weights + p_last["bytes"]) / BANDWIDTH
            held = round(poller.largest * blocks)
            print(f"| {length} | {prompt} | {ttft:.2f} | {prompt / ttft:.0f} | {step * 1e3:.3f} | "
                  f"{floor * 1e3:.4f} ({weights / 1e9:.3f} GB + {p_last['bytes'] / 1e9:.3f} GB) | "
                  f"{held}, {held * block_bytes / 2**30:.3f} | {p_first['blocks']}-{p_last['blocks']}, "
                  f"{p_last['blocks'] * p_last['block_bytes'] / 2**30:.3f} | {p_last['bytes_per_token']} B |", flush=True)
            print(f"<!-- {length}: body {body_bytes} bytes, usage max {poller.largest:.6f} -->", flush=True)
    finally:
        poller.stop.set()
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()

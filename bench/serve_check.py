#!/usr/bin/env python3
"""Serving comparison for bench/gpu_check.sh (python3 stdlib only): 32 concurrent greedy /v1/completions requests
to `beamline serve --device cuda` against the same requests one at a time (>= 90% equal token for token), against
the same concurrent requests with --enforce-eager (recorded decode graphs vs op by op) and with --no-async-scheduling
(the default launches the next step before this step's tokens are read; this waits for them), and their first 16
tokens
against `beamline serve --device cpu` (>= 90% equal). Prints Markdown table rows.

  serve_check.py BEAMLINE_BINARY MODEL_DIR
"""
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request

REQUESTS = 32
MAX_TOKENS = 16
REQUIRED = 0.9


def start_server(binary, model, device, port, extra=()):
    # The GPU server sizes its KV cache from the device's memory, as `vllm serve` does.
    budget = ["--gpu-memory-utilization", "0.3"] if device == "cuda" else ["--kv-cache-memory", "4G"]
    # Both servers compute in FP32 with an F32 KV cache, so their tokens can be compared one for one.
    budget += ["--dtype", "float32", "--kv-cache-dtype", "float32", *extra]
    process = subprocess.Popen([binary, "serve", "--model", model, "--device", device, "--port", str(port), *budget],
                               stdout=sys.stderr, stderr=sys.stderr)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.5)
        if process.poll() is not None:
            raise RuntimeError(f"beamline serve --device {device} exited with {process.returncode}")
    process.kill()
    raise RuntimeError(f"beamline serve --device {device} did not become healthy")


def model_name(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
        return json.load(response)["data"][0]["id"]


# The completion's text: the same tokenizer decodes both sides, so equal text means equal greedy tokens.
def complete(port, model, prompt):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["text"]


def run_all(port, prompts, concurrent):
    results = [None] * len(prompts)
    model = model_name(port)

    def worker(i):
        results[i] = complete(port, model, prompts[i])

    if concurrent:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for i in range(len(prompts)):
            worker(i)
    return results


def row(name, matches, limit_fraction):
    passed = matches >= limit_fraction * REQUESTS
    print(f"| {name} | {matches} of {REQUESTS} requests equal | >= {limit_fraction:.0%} | "
          f"{'pass' if passed else '**FAIL**'} |")
    return passed


# Runs `work(port)` against a server started with these flags, then stops the server.
def with_server(binary, model, device, port, extra, work):
    server = start_server(binary, model, device, port, extra)
    try:
        return work(port)
    finally:
        server.terminate()
        server.wait()


def main(binary, model):
    rng = random.Random(5)
    prompts = [[rng.randrange(1000) for _ in range(rng.randrange(8, 200))] for _ in range(REQUESTS)]
    batched, alone = with_server(binary, model, "cuda", 8311, [], lambda port: (
        run_all(port, prompts, concurrent=True), run_all(port, prompts, concurrent=False)))
    # The same concurrent requests with every decode step run op by op instead of replaying recorded graphs.
    eager = with_server(binary, model, "cuda", 8313, ["--enforce-eager"],
                        lambda port: run_all(port, prompts, concurrent=True))
    # And with the synchronous loop: each step waits for the previous step's tokens (the default overlaps them).
    synchronous = with_server(binary, model, "cuda", 8314, ["--no-async-scheduling"],
                              lambda port: run_all(port, prompts, concurrent=True))
    cpu = with_server(binary, model, "cpu", 8312, [], lambda port: run_all(port, prompts, concurrent=False))
    ok = row("serve --device cuda: 32 concurrent vs one at a time (greedy, 16 tokens)",
             sum(a == b for a, b in zip(batched, alone)), REQUIRED)
    ok &= row("serve --device cuda: 32 concurrent, decode graphs vs --enforce-eager",
              sum(a == b for a, b in zip(batched, eager)), REQUIRED)
    ok &= row("serve --device cuda: 32 concurrent, --async-scheduling (default) vs --no-async-scheduling",
              sum(a == b for a, b in zip(batched, synchronous)), REQUIRED)
    ok &= row("serve: cuda vs cpu, first 16 tokens", sum(a == b for a, b in zip(alone, cpu)), REQUIRED)
    return ok


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if main(sys.argv[1], sys.argv[2]) else 1)

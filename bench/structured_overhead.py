#!/usr/bin/env python3
"""What structured outputs cost a served model: `beamline serve` (the default model, beam-nano, on the CPU) with the
Harmony template constraint on (the default, tool arguments held to their schemas), on without jump-forward, and off
(--no-harmony-constraint), under the same chat workload: B concurrent requests with two tools at temperature 0.

The three servers run side by side and the rounds interleave them (round r runs every server's batch before round
r + 1), so the shared machine's load drifts over all three alike. Throughput = completion tokens of a batch over its
wall time (median over rounds); steps = the server's beamline:engine_steps_total over the run. At temperature 0 a
trained model mostly writes the same turns with or without the constraint; the table says how many outputs equal the
unconstrained server's, since a different output is a different amount of work. Pure Python 3.

  python3 bench/structured_overhead.py build/apps/beamline/beamline [--batches 1,16] [--rounds 5] [--max-tokens 160]
      [--configs off,on,on-no-jump-forward] [--serve-args "--device cuda --model DIR ..."]

--serve-args go to every server (another device or model: bench/gpu_structured_batch64.sh runs it on the H200);
--configs picks which of the three run (the first listed is the one the others are compared with).
"""
import argparse
import concurrent.futures
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name, e.g. Paris", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a time zone.",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "pattern": "^[A-Z][A-Za-z_]+/[A-Z][A-Za-z_]+$"}},
            "required": ["timezone"], "additionalProperties": False}}},
]
PROMPTS = [
    "What's the weather in Paris?", "Is it cold in Oslo right now? Use fahrenheit.", "What time is it in Europe/Berlin?",
    "Weather for Tokyo, please.", "Say hello.", "How warm is it in Lisbon in celsius?", "What time is it in Asia/Tokyo?",
    "Tell me a fun fact about octopuses.",
]
CONFIGS = {"off": ("off (--no-harmony-constraint)", ["--no-harmony-constraint"]),
           "on": ("on (default)", []),
           "on-no-jump-forward": ("on, --no-jump-forward", ["--no-jump-forward"])}


MODEL = {}  # port -> the model name its server answers to


def start(binary, extra):
    args = [binary, "serve", "--port", "0", "--max-model-len", "4096", "--kv-cache-memory", "256M", *extra]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = ""
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log += line
        match = re.search(r"at http://[^:]+:(\d+)/v1", line)
        if match:
            return proc, int(match.group(1))
    proc.kill()
    sys.exit(f"server {extra} did not start:\n{log}")


def post(port, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        text = response.read().decode()
        return json.loads(text) if body is not None else text


def metric(port, name):
    for line in post(port, "/metrics").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


def served_model(port):
    return json.loads(post(port, "/v1/models"))["data"][0]["id"]


def chat(port, prompt, max_tokens):
    body = {"model": MODEL[port], "messages": [{"role": "user", "content": prompt}], "tools": TOOLS,
            "temperature": 0, "max_tokens": max_tokens}
    reply = post(port, "/v1/chat/completions", body)
    message = reply["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return reply["usage"]["completion_tokens"], (message.get("content"), message.get("reasoning_content"), calls)


def run_batch(port, batch, max_tokens):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    start_time = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(batch) as pool:
        results = list(pool.map(lambda p: chat(port, p, max_tokens), prompts))
    return time.perf_counter() - start_time, sum(r[0] for r in results), [r[1] for r in results]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binary")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--serve-args", default="")
    args = parser.parse_args()
    unknown = [key for key in args.configs.split(",") if key not in CONFIGS]
    if unknown:
        sys.exit(f"--configs: unknown {unknown} (known: {', '.join(CONFIGS)})")
    configs = [CONFIGS[key] for key in args.configs.split(",")]
    servers = [(name, *start(args.binary, extra + shlex.split(args.serve_args))) for name, extra in configs]
    try:
        for _, _, port in servers:
            MODEL[port] = served_model(port)
        for _, _, port in servers:  # warm up: first requests compile the tool grammar (cached after)
            run_batch(port, 2, args.max_tokens)
        steps_before = {name: metric(port, "beamline:engine_steps_total") for name, _, port in servers}
        results = {}  # (name, batch) -> [(seconds, tokens)], outputs of the last round
        outputs = {}
        for _ in range(args.rounds):
            for batch in [int(b) for b in args.batches.split(",")]:
                for name, _, port in servers:
                    seconds, tokens, texts = run_batch(port, batch, args.max_tokens)
                    results.setdefault((name, batch), []).append((seconds, tokens))
                    outputs[(name, batch)] = texts
        steps = {name: metric(port, "beamline:engine_steps_total") - steps_before[name] for name, _, port in servers}
        forced = {name: (metric(port, "beamline:jump_forward_draft_tokens_total"),
                         metric(port, "beamline:jump_forward_accepted_tokens_total")) for name, _, port in servers}
    finally:
        for _, proc, _ in servers:
            proc.terminate()
            proc.wait()

    off = configs[0][0]
    first = args.configs.split(",")[0]
    print(f"| structured outputs | batch | completion tokens | wall s (median) | tokens/s (median) | vs {first} | "
          f"outputs equal to {first}'s | engine steps (all rounds) | forced tokens drafted / accepted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch in [int(b) for b in args.batches.split(",")]:
        base = statistics.median(t / s for s, t in results[(off, batch)])
        for name, _ in configs:
            runs = results[(name, batch)]
            rate = statistics.median(t / s for s, t in runs)
            same = sum(a == b for a, b in zip(outputs[(name, batch)], outputs[(off, batch)]))
            print(f"| {name} | {batch} | {runs[-1][1]} | {statistics.median(s for s, _ in runs):.3f} | {rate:.1f} | "
                  f"{100 * (rate / base - 1):+.1f}% | {same} / {batch} | {steps[name]:.0f} | "
                  f"{forced[name][0]:.0f} / {forced[name][1]:.0f} |")


if __name__ == "__main__":
    main()

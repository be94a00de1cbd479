#!/usr/bin/env python3
"""What structured outputs cost a served model: `beamline serve` (the default model, beam-nano, on the CPU) with the
Harmony template constraint on (the default, tool arguments held to their schemas), on without jump-forward, and off
(--no-harmony-constraint), under the same chat workload: B concurrent requests with two tools at temperature 0.

The three servers run side by side and the rounds interleave them (round r runs every server's batch before round
r + 1), so the shared machine's load drifts over all three alike. Throughput = completion tokens of a batch over its
wall time (median over rounds, with the 25th-75th percentiles); "paired" is the median over rounds of each round's
rate over the first config's rate in the same round (the machine's drift cancels); steps = the server's
beamline:engine_steps_total over the run. At temperature 0 a trained model mostly writes the same turns with or
without the constraint; the table says how many outputs (last round) equal the first config's, since a different
output is a different amount of work, and a second table says why each one differs:
  - "first invalid": the first config's output breaks the template (cut by max_tokens, special tokens left in the
    text, a `<|call|>` with no recipient, a tool that is not declared, arguments that do not parse or break the
    tool's schema): the constraint corrected it;
  - "first unstable": the first config itself wrote different outputs for that prompt (across rounds or across the
    copies of the prompt in one batch): its argmax sits on a near-tie that the batch's composition flips (BF16 on a
    GPU), so this config's differing output is numerics too;
  - "first stable": the first config always wrote the same output, this one a different valid one: the batch shape
    differs (jump-forward rows) and moved a near-tie, or a bug; --batch-invariant tells the two apart;
  - "INVALID here": this config's own output breaks the template (a bug when the constraint is on).
Pure Python 3.

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
    choice = reply["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return reply["usage"]["completion_tokens"], (message.get("content"), message.get("reasoning_content"), calls,
                                                  choice.get("finish_reason"))


def schema_errors(schema, value):
    """What breaks the subset of JSON Schema TOOLS use (type object/string, properties, required,
    additionalProperties, enum, maxLength, pattern); empty when the value is valid."""
    if schema.get("type") == "object":
        if not isinstance(value, dict):
            return ["not an object"]
        errors = [f"missing {key}" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key not in schema["properties"]:
                errors.append(f"undeclared {key}")
            else:
                errors += [f"{key}: {e}" for e in schema_errors(schema["properties"][key], item)]
        return errors
    if schema.get("type") == "string":
        if not isinstance(value, str):
            return ["not a string"]
        errors = []
        if "enum" in schema and value not in schema["enum"]:
            errors.append(f"{value!r} not in enum")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{value!r} does not match the pattern")
        return errors
    return [f"unchecked type {schema.get('type')}"]


def template_errors(output):
    """Why a chat output is not a complete Harmony turn whose calls hold to TOOLS (empty when it is one)."""
    content, reasoning, calls, finish = output
    errors = []
    if finish not in ("stop", "tool_calls"):
        errors.append(f"finish_reason {finish}")
    if finish == "tool_calls" and not calls:
        errors.append("<|call|> with no recipient (a message the parser could not make a call of)")
    for text in (content, reasoning):
        if text and "<|" in text:
            errors.append("a special token in the text")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for name, arguments in calls:
        if name not in schemas:
            errors.append(f"undeclared tool {name}")
            continue
        try:
            errors += [f"{name}: {e}" for e in schema_errors(schemas[name], json.loads(arguments))]
        except json.JSONDecodeError:
            errors.append(f"{name}: arguments are not JSON")
    return errors


def classify(rounds, base_rounds, batch):
    """Why each output of the last round differs from the base config's (see the module's docstring)."""
    counts = {"first invalid": 0, "first unstable": 0, "first stable": 0, "INVALID here": 0}
    details = []
    for i, (mine, base) in enumerate(zip(rounds[-1], base_rounds[-1])):
        if mine == base:
            continue
        prompt = i % len(PROMPTS)
        seen = {repr(r[j]) for r in base_rounds for j in range(prompt, batch, len(PROMPTS))}
        if template_errors(mine):
            kind = "INVALID here"
        elif template_errors(base):
            kind = "first invalid"
        elif len(seen) > 1:
            kind = "first unstable"
        else:
            kind = "first stable"
        counts[kind] += 1
        details.append((i, kind, template_errors(base) or template_errors(mine), len(seen)))
    return counts, details


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
        results = {}  # (name, batch) -> [(seconds, tokens)] and [outputs], one per round
        outputs = {}
        for _ in range(args.rounds):
            for batch in [int(b) for b in args.batches.split(",")]:
                for name, _, port in servers:
                    seconds, tokens, texts = run_batch(port, batch, args.max_tokens)
                    results.setdefault((name, batch), []).append((seconds, tokens))
                    outputs.setdefault((name, batch), []).append(texts)
        steps = {name: metric(port, "beamline:engine_steps_total") - steps_before[name] for name, _, port in servers}
        forced = {name: (metric(port, "beamline:jump_forward_draft_tokens_total"),
                         metric(port, "beamline:jump_forward_accepted_tokens_total")) for name, _, port in servers}
    finally:
        for _, proc, _ in servers:
            proc.terminate()
            proc.wait()

    off = configs[0][0]
    first = args.configs.split(",")[0]
    batches = [int(b) for b in args.batches.split(",")]

    def quantile(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]

    print(f"| structured outputs | batch | completion tokens | wall s (median) | tokens/s (median) | p25-p75 | vs {first} | "
          f"paired vs {first} (median, min-max) | outputs equal to {first}'s | engine steps (all rounds) | "
          f"forced tokens drafted / accepted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch in batches:
        base_rates = [t / s for s, t in results[(off, batch)]]
        base = statistics.median(base_rates)
        for name, _ in configs:
            runs = results[(name, batch)]
            rates = [t / s for s, t in runs]
            paired = [r / b - 1 for r, b in zip(rates, base_rates)]
            same = sum(a == b for a, b in zip(outputs[(name, batch)][-1], outputs[(off, batch)][-1]))
            print(f"| {name} | {batch} | {runs[-1][1]} | {statistics.median(s for s, _ in runs):.3f} | "
                  f"{statistics.median(rates):.1f} | {quantile(rates, 0.25):.0f}-{quantile(rates, 0.75):.0f} | "
                  f"{100 * (statistics.median(rates) / base - 1):+.1f}% | {100 * statistics.median(paired):+.1f}% "
                  f"({100 * min(paired):+.1f}% to {100 * max(paired):+.1f}%) | {same} / {batch} | {steps[name]:.0f} | "
                  f"{forced[name][0]:.0f} / {forced[name][1]:.0f} |")

    print(f"\nWhy outputs (last round) differ from {first}'s: {first} invalid (the constraint corrected it) / {first} "
          f"unstable (near-tie numerics) / {first} stable (batch shape or a bug) / INVALID here")
    print(f"\n| structured outputs | batch | differ | {first} invalid | {first} unstable | {first} stable | INVALID here |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    listed = []
    for batch in batches:
        for name, _ in configs:
            counts, details = classify(outputs[(name, batch)], outputs[(off, batch)], batch)
            print(f"| {name} | {batch} | {len(details)} | {counts['first invalid']} | {counts['first unstable']} | "
                  f"{counts['first stable']} | {counts['INVALID here']} |")
            listed += [(name, batch, *d) for d in details]
    for name, batch, i, kind, errors, distinct in listed:
        print(f"- {name}, batch {batch}, request {i} ({PROMPTS[i % len(PROMPTS)]!r}): {kind}; {first} wrote {distinct} "
              f"distinct output(s) for this prompt over the rounds{'; ' + ', '.join(errors) if errors else ''}")

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The client side of bench/soak.sh: a mixed OpenAI workload against one running `beamline serve` for a set time.

CONCURRENCY workers each send one request after another, the kind drawn from KINDS: chat and completions, each
streamed and not; a tool call (and, when the model calls, the round trip with the tool's result); n > 1, streamed
and not; and aborts, a client closing its connection mid-stream or before a non-streamed answer. Every answer is
checked (status, choices, finish_reason, usage, the stream's end); an abort only has to be accepted. Meanwhile the
server's resident memory (VmRSS of /proc/PID/status) is sampled each minute and /health is probed every
HEALTH_PERIOD seconds. At the end, once the engine is idle: no failure, every request the engine finished accounted
for (vllm:request_success_total against what the client sent, so none lost or answered twice), every KV block
free (vllm:kv_cache_usage_perc 0), no open stream, and RSS after warm-up flat within RSS_TOLERANCE.
Writes OUT/summary.md, OUT/minutes.tsv, OUT/health.tsv and OUT/failures.txt; exits 1 when a check fails.
Python 3 standard library only.
"""
import argparse
import http.client
import json
import random
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlparse

# kind: weight. Aborts are about a fifth of the streams, as issue 22's load check asks of its clients.
KINDS = {
    "chat": 3, "chat_stream": 3, "completion": 2, "completion_stream": 2, "tools": 2,
    "n_chat": 1, "n_completion_stream": 1, "abort_stream": 2, "abort_nonstream": 1,
}
HEALTH_PERIOD = 5.0
RSS_TOLERANCE = 0.05
REQUEST_TIMEOUT = 300.0
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar", "Riga"]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


class Failure(Exception):
    pass


class Server:
    def __init__(self, base_url, pid):
        url = urlparse(base_url)
        self.host, self.port, self.pid = url.hostname, url.port, pid

    def connect(self, timeout=REQUEST_TIMEOUT):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path, timeout=30.0):
        conn = self.connect(timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no VmRSS in /proc/{self.pid}/status")

    def metrics(self):
        """Every sample of /metrics summed over its labels but one: {name: total}, {(name, label value): total}."""
        _, text = self.get("/metrics")
        totals, labelled = Counter(), Counter()
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            name = key.split("{", 1)[0]
            totals[name] += float(value)
            for label in ("finished_reason", "code"):
                marker = f'{label}="'
                if marker in key:
                    labelled[(name, key.split(marker, 1)[1].split('"', 1)[0])] += float(value)
        return totals, labelled


def post(server, path, body):
    conn = server.connect()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def expect_ok(conn, response):
    if response.status != 200:
        text = response.read().decode(errors="replace")[:300]
        conn.close()
        raise Failure(f"HTTP {response.status}: {text}")


def read_json(server, path, body):
    conn, response = post(server, path, body)
    try:
        expect_ok(conn, response)
        return json.loads(response.read())
    finally:
        conn.close()


def read_stream(server, path, body):
    """The chunks of a whole stream; fails when it does not end with data: [DONE]."""
    conn, response = post(server, path, body)
    try:
        expect_ok(conn, response)
        chunks = []
        while True:
            line = response.readline()
            if not line:
                raise Failure(f"the stream ended after {len(chunks)} chunks without data: [DONE]")
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                return chunks
            chunks.append(json.loads(line[6:]))
    finally:
        conn.close()


def check_choices(choices, n, max_tokens, usage, reasons=("stop", "length")):
    if sorted(c["index"] for c in choices) != list(range(n)):
        raise Failure(f"choice indexes {[c['index'] for c in choices]}, wanted 0..{n - 1}")
    for choice in choices:
        if choice.get("finish_reason") not in reasons:
            raise Failure(f"finish_reason {choice.get('finish_reason')!r} not in {reasons}")
    if not usage or not 1 <= usage["completion_tokens"] <= n * max_tokens or usage["prompt_tokens"] < 1:
        raise Failure(f"usage {usage} for n={n}, max_tokens={max_tokens}")


def check_stream(chunks, n, max_tokens):
    """Each choice of a stream ends once with a finish_reason; the last chunk carries usage."""
    finished = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            if choice.get("finish_reason"):
                if choice["index"] in finished:
                    raise Failure(f"choice {choice['index']} finished twice")
                finished[choice["index"]] = choice
    check_choices(list(finished.values()), n, max_tokens, chunks[-1].get("usage") if chunks else None)


class Workload:
    def __init__(self, server, model, seed):
        self.server, self.model = server, model
        self.random = random.Random(seed)
        self.lock = threading.Lock()

    def draw(self):
        with self.lock:
            kind = self.random.choices(list(KINDS), weights=list(KINDS.values()))[0]
            return kind, self.random.randrange(1 << 30)

    def question(self, rng):
        a, b = rng.randrange(10, 10000), rng.randrange(10, 10000)
        return rng.choice([
            f"What is {a} + {b}?", f"What is {a} times {b % 100}?", f"Convert {a} meters to kilometers.",
            f"What is the capital of {rng.choice(['France', 'Japan', 'Peru', 'Norway', 'Egypt'])}? (ticket {a})",
            f"Say hello to user {a}.",
        ])

    def run(self, kind, seed):
        """Runs one request of `kind`; returns the number of generation requests the engine saw (0 to 2)."""
        rng = random.Random(seed)
        max_tokens = rng.randrange(16, 97)
        chat = {"model": self.model, "messages": [{"role": "user", "content": self.question(rng)}],
                "max_tokens": max_tokens, "temperature": 0.8, "seed": seed}
        completion = {"model": self.model, "prompt": self.question(rng), "max_tokens": max_tokens,
                      "temperature": 0.8, "seed": seed}
        stream = {"stream": True, "stream_options": {"include_usage": True}}
        if kind == "chat":
            reply = read_json(self.server, "/v1/chat/completions", chat)
            check_choices(reply["choices"], 1, max_tokens, reply.get("usage"))
        elif kind == "chat_stream":
            check_stream(read_stream(self.server, "/v1/chat/completions", chat | stream), 1, max_tokens)
        elif kind == "completion":
            reply = read_json(self.server, "/v1/completions", completion)
            check_choices(reply["choices"], 1, max_tokens, reply.get("usage"))
        elif kind == "completion_stream":
            check_stream(read_stream(self.server, "/v1/completions", completion | stream), 1, max_tokens)
        elif kind == "n_chat":
            n = rng.randrange(2, 5)
            reply = read_json(self.server, "/v1/chat/completions", chat | {"n": n})
            check_choices(reply["choices"], n, max_tokens, reply.get("usage"))
        elif kind == "n_completion_stream":
            n = rng.randrange(2, 5)
            check_stream(read_stream(self.server, "/v1/completions", completion | stream | {"n": n}), n, max_tokens)
        elif kind == "tools":
            return self.tool_round_trip(rng)
        elif kind == "abort_stream":
            self.abort(rng, "/v1/chat/completions", chat | stream | {"max_tokens": 256}, streamed=True)
        elif kind == "abort_nonstream":
            self.abort(rng, "/v1/completions", completion | {"max_tokens": 256}, streamed=False)
        return 1

    def tool_round_trip(self, rng):
        city = rng.choice(CITIES)
        messages = [{"role": "user", "content": f"What's the weather in {city}?"}]
        body = {"model": self.model, "messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": 200}
        reply = read_json(self.server, "/v1/chat/completions", body)
        choice = reply["choices"][0]
        check_choices(reply["choices"], 1, 200, reply.get("usage"), ("stop", "length", "tool_calls"))
        if choice["finish_reason"] != "tool_calls":
            return 1
        call = choice["message"]["tool_calls"][0]
        if call["function"]["name"] != "get_weather":
            raise Failure(f"tool call names {call['function']['name']!r}")
        arguments = json.loads(call["function"]["arguments"])
        if not isinstance(arguments.get("city"), str):
            raise Failure(f"tool arguments {arguments} lack the city string the schema requires")
        messages += [choice["message"], {"role": "tool", "tool_call_id": call["id"],
                                         "content": json.dumps({"temperature": rng.randrange(-5, 35)})}]
        answer = read_json(self.server, "/v1/chat/completions", body | {"messages": messages})
        check_choices(answer["choices"], 1, 200, answer.get("usage"), ("stop", "length", "tool_calls"))
        return 2

    def abort(self, rng, path, body, streamed):
        """Sends the request and hangs up: after 1-8 chunks of a stream, or 0.05-1 s into a non-streamed one."""
        conn, response = None, None
        try:
            if streamed:
                conn, response = post(self.server, path, body)
                expect_ok(conn, response)
                for _ in range(rng.randrange(1, 9)):
                    if not response.readline():
                        break
            else:
                conn = self.server.connect()
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                time.sleep(rng.uniform(0.05, 1.0))
        finally:
            if conn is not None and conn.sock is not None:
                conn.sock.shutdown(socket.SHUT_RDWR)
            if conn is not None:
                conn.close()


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the server's pid, for /proc/PID/status")
    parser.add_argument("--duration", type=float, required=True, help="seconds of load")
    parser.add_argument("--warmup", type=float, required=True, help="seconds before RSS must stay flat")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    server = Server(args.base_url, args.pid)
    model = json.loads(server.get("/v1/models")[1])["data"][0]["id"]
    workload = Workload(server, model, args.seed)
    start = time.monotonic()
    deadline = start + args.duration
    done, failed, engine_requests, failures = Counter(), Counter(), Counter(), []
    lock = threading.Lock()

    def worker():
        while time.monotonic() < deadline:
            kind, seed = workload.draw()
            began = time.monotonic()
            try:
                count = workload.run(kind, seed)
                with lock:
                    done[kind] += 1
                    engine_requests[kind] += count
            except Exception as error:  # every failure is recorded; the soak goes on
                with lock:
                    failed[kind] += 1
                    engine_requests[kind] += 1
                    failures.append(f"{began - start:8.1f} s {kind}: {type(error).__name__}: {error}")

    health = []  # (seconds since start, HTTP code, milliseconds)

    def prober():
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                code = server.get("/health", timeout=60.0)[0]
            except OSError:
                code = 0
            health.append((began - start, code, (time.monotonic() - began) * 1000))
            time.sleep(max(0.0, HEALTH_PERIOD - (time.monotonic() - began)))

    minutes = []  # (minute, RSS KiB, requests done so far, KV usage, running, waiting)

    def sample(minute):
        totals, _ = server.metrics()
        with lock:
            finished = sum(done.values()) + sum(failed.values())
        minutes.append((minute, server.rss_kib(), finished, totals["vllm:kv_cache_usage_perc"],
                        totals["vllm:num_requests_running"], totals["vllm:num_requests_waiting"]))

    rss_idle = server.rss_kib()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)] + [threading.Thread(target=prober)]
    for thread in threads:
        thread.start()
    minute = 1
    while (next_sample := start + 60 * minute) <= deadline:
        time.sleep(max(0.0, next_sample - time.monotonic()))
        sample(minute)
        print(f"minute {minute}: RSS {minutes[-1][1] / 1024:.1f} MiB, {minutes[-1][2]} requests", flush=True)
        minute += 1
    for thread in threads:
        thread.join()
    wall = time.monotonic() - start

    # The engine finishes what the last requests left (an abort's cleanup), then must hold nothing.
    for _ in range(120):
        totals, labelled = server.metrics()
        if totals["vllm:num_requests_running"] == 0 and totals["vllm:num_requests_waiting"] == 0:
            break
        time.sleep(0.5)
    rss_end = server.rss_kib()
    reasons = {r: labelled[("vllm:request_success_total", r)] for r in ("stop", "length", "abort")}
    codes = {code: int(v) for (name, code), v in labelled.items() if name == "beamline:http_responses_total"}

    after = [rss for m, rss, *_ in minutes if m * 60 >= args.warmup]
    spread = (max(after) - min(after)) / after[0] if after else float("nan")
    times = [ms for _, code, ms in health if code == 200]
    aborts = done["abort_stream"] + done["abort_nonstream"]
    checks = {
        "no request failed": sum(failed.values()) == 0,
        "every /health probe answered 200": all(code == 200 for _, code, _ in health),
        "engine idle at the end (running, waiting 0)":
            totals["vllm:num_requests_running"] == 0 and totals["vllm:num_requests_waiting"] == 0,
        "vllm:kv_cache_usage_perc back to 0": totals["vllm:kv_cache_usage_perc"] == 0,
        "no open stream (beamline:http_streams_active 0)": totals["beamline:http_streams_active"] == 0,
        "no engine error (beamline:request_failed_total 0)": totals["beamline:request_failed_total"] == 0,
        "engine finished exactly the requests sent": sum(reasons.values()) == sum(engine_requests.values()),
        "engine aborts <= client aborts": reasons["abort"] <= aborts,
        f"RSS after warm-up flat within {RSS_TOLERANCE:.0%}": len(after) >= 2 and spread <= RSS_TOLERANCE,
    }

    with open(f"{args.out}/minutes.tsv", "w") as out:
        out.write("minute\trss_kib\trequests_done\tkv_cache_usage_perc\trunning\twaiting\n")
        for row in minutes:
            out.write("\t".join(str(v) for v in row) + "\n")
    with open(f"{args.out}/health.tsv", "w") as out:
        out.write("seconds\tcode\tms\n")
        for t, code, ms in health:
            out.write(f"{t:.1f}\t{code}\t{ms:.2f}\n")
    with open(f"{args.out}/failures.txt", "w") as out:
        out.write("".join(f"{line}\n" for line in failures))

    lines = [
        f"Load: {args.concurrency} workers, {args.duration:.0f} s ({wall:.0f} s with the last requests), "
        f"warm-up {args.warmup:.0f} s, seed {args.seed}; model `{model}`.",
        "",
        "| kind | done | failed | engine requests |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {k} | {done[k]} | {failed[k]} | {engine_requests[k]} |" for k in KINDS]
    lines += [
        f"| **all** | {sum(done.values())} | {sum(failed.values())} | {sum(engine_requests.values())} |",
        "",
        f"Engine: request_success_total stop {reasons['stop']:.0f}, length {reasons['length']:.0f}, "
        f"abort {reasons['abort']:.0f} (sum {sum(reasons.values()):.0f}); HTTP responses by code {codes}.",
        f"/health: {len(health)} probes, {len(health) - len(times)} not 200, p50 / p95 / max "
        f"{percentile(times, 0.5):.1f} / {percentile(times, 0.95):.1f} / {max(times, default=float('nan')):.1f} ms, "
        f"{sum(t > 100 for t in times)} over 100 ms.",
        f"At the end: running {totals['vllm:num_requests_running']:.0f}, waiting "
        f"{totals['vllm:num_requests_waiting']:.0f}, vllm:kv_cache_usage_perc {totals['vllm:kv_cache_usage_perc']}, "
        f"open streams {totals['beamline:http_streams_active']:.0f}.",
        "",
        f"RSS: {rss_idle / 1024:.1f} MiB idle before the load, {rss_end / 1024:.1f} MiB at the end; after warm-up "
        f"min {min(after, default=0) / 1024:.1f}, max {max(after, default=0) / 1024:.1f} MiB, spread "
        f"{spread:.2%} of the first sample after warm-up.",
        "",
        "| minute | RSS (MiB) | requests done | KV usage | running | waiting | /health max in the minute (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, rss, finished, kv, running, waiting in minutes:
        in_minute = [ms for t, code, ms in health if (m - 1) * 60 <= t < m * 60]
        lines.append(f"| {m} | {rss / 1024:.1f} | {finished} | {kv:.3f} | {running:.0f} | {waiting:.0f} | "
                     f"{max(in_minute, default=float('nan')):.1f} |")
    lines += ["", "| check | result |", "|---|---|"]
    lines += [f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in checks.items()]
    if failures:
        lines += ["", "First failures:", ""] + [f"    {line}" for line in failures[:10]]
    with open(f"{args.out}/summary.md", "w") as out:
        out.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

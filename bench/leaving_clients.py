#!/usr/bin/env python3
"""Concurrent streaming clients of which a fraction leave at random points (issue 22's load check).

Every client opens its own connection at once, sends one streaming /v1/completions request and reads the server-sent
events; a leaving client closes its connection after a random number of events (0: before the first), the others read
to `data: [DONE]`. Writes a JSON with `beamline bench serve`'s summary keys (completed, failed, max_concurrent_requests,
output_throughput, TTFT and E2EL percentiles) plus `left` and the first errors, so bench/serve_many_clients.sh reports
either client the same way. Standard library only (asyncio), to hold thousands of connections in one process.

Usage: leaving_clients.py BASE_URL CLIENTS LEAVE_FRACTION OUTPUT_LEN SEED OUT_JSON
"""
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlparse


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def one_client(host, port, index, leave_after, output_len, stats):
    body = json.dumps({"prompt": f"client {index} story", "max_tokens": output_len, "ignore_eos": True,
                       "stream": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    start = time.monotonic()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        stats["open"] += 1
        stats["peak_open"] = max(stats["peak_open"], stats["open"])
        writer.write(request)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"status {status_line.decode(errors='replace').strip()!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        if leave_after == 0:
            stats["left"] += 1
            return
        events, first = 0, None
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise RuntimeError(f"connection closed after {events} events without [DONE]")
            size = int(size_line.strip(), 16)
            if size == 0:
                raise RuntimeError(f"stream ended after {events} events without [DONE]")
            chunk = await reader.readexactly(size + 2)
            if first is None:
                first = time.monotonic()
            if b"data: [DONE]" in chunk:
                stats["completed"] += 1
                stats["ttft"].append((first - start) * 1000)
                stats["e2el"].append((time.monotonic() - start) * 1000)
                stats["tokens"] += output_len
                return
            events += chunk.count(b"data: ")
            if leave_after is not None and events >= leave_after:
                stats["left"] += 1
                return
    except Exception as error:  # every failure is counted and the first ones named
        stats["failed"] += 1
        if len(stats["errors"]) < 20:
            stats["errors"].append(f"client {index}: {type(error).__name__}: {error}")
    finally:
        if writer is not None:
            stats["open"] -= 1
            writer.close()


async def main():
    base, clients, leave_fraction, output_len, seed, out = sys.argv[1:7]
    url = urlparse(base)
    clients, leave_fraction, output_len = int(clients), float(leave_fraction), int(output_len)
    rng = random.Random(int(seed))
    plan = [rng.randint(0, output_len - 1) if rng.random() < leave_fraction else None for _ in range(clients)]
    stats = {"completed": 0, "failed": 0, "left": 0, "open": 0, "peak_open": 0, "tokens": 0, "ttft": [], "e2el": [],
             "errors": []}
    start = time.monotonic()
    await asyncio.gather(*(one_client(url.hostname, url.port, i, plan[i], output_len, stats) for i in range(clients)))
    duration = time.monotonic() - start
    result = {
        "clients": clients, "leave_fraction": leave_fraction, "planned_to_leave": sum(p is not None for p in plan),
        "completed": stats["completed"], "failed": stats["failed"], "left": stats["left"],
        "max_concurrent_requests": stats["peak_open"], "duration": duration,
        "output_throughput": stats["tokens"] / duration,
        "median_ttft_ms": percentile(stats["ttft"], 0.5), "p99_ttft_ms": percentile(stats["ttft"], 0.99),
        "median_e2el_ms": percentile(stats["e2el"], 0.5), "p99_e2el_ms": percentile(stats["e2el"], 0.99),
        "errors": stats["errors"],
    }
    with open(out, "w") as file:
        json.dump(result, file, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "errors"}))
    for error in stats["errors"]:
        print(error)


if __name__ == "__main__":
    asyncio.run(main())

#!/usr/bin/env python3
"""The throughput cost of routing replay: generation with and without return_routed_experts on one server.

Serves MODEL (default models/beam-nano) with --enable-return-routed-experts and, alternating, sends rounds of B
concurrent /v1/completions requests of P random prompt ids and D output tokens (temperature 0, ignore_eos), either
plain or with return_routed_experts (and return_token_ids both times, so the answers differ by the routing only).
Random prompts never hit the prefix cache, so skipping it costs nothing here. Prints each round's tokens/s (prompt +
output tokens over the round's wall time), the server's CPU time per token (user + system, from /proc: steadier
than wall time on a shared machine) and the medians' ratios.

Usage: python3 bench/routed_experts_cost.py BINARY [--model DIR] [--device cpu] [--batch 8] [--prompt 64]
                                            [--decode 64] [--rounds 4] [--serve-args '...']
"""
import argparse
import concurrent.futures
import os
import random
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "reference"))
from beamline_server import Server, post  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binary")
    parser.add_argument("--model", default=os.path.join(HERE, "..", "models", "beam-nano"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--serve-args", default="")
    args = parser.parse_args()
    rng = random.Random(0)
    name = os.path.basename(os.path.normpath(args.model))
    server = Server(args.binary, args.model, args.device,
                    ["--enable-return-routed-experts"] + shlex.split(args.serve_args))
    rates = {False: [], True: []}
    cpu = {False: [], True: []}
    ticks = os.sysconf("SC_CLK_TCK")

    def server_cpu_seconds():
        with open(f"/proc/{server.proc.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime

    try:
        def round_rate(routed):
            bodies = [{"model": name, "prompt": [rng.randrange(0, 3000) for _ in range(args.prompt)],
                       "max_tokens": args.decode, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                       "return_routed_experts": routed} for _ in range(args.batch)]
            start, start_cpu = time.perf_counter(), server_cpu_seconds()
            with concurrent.futures.ThreadPoolExecutor(args.batch) as pool:
                for status, body in pool.map(lambda b: post(server.base, "/v1/completions", b), bodies):
                    assert status == 200, body
                    assert ("routed_experts" in body["choices"][0]) == routed, body
            tokens = args.batch * (args.prompt + args.decode)
            cpu[routed].append(1e6 * (server_cpu_seconds() - start_cpu) / tokens)
            return tokens / (time.perf_counter() - start)

        round_rate(False)  # warm-up
        for _ in range(args.rounds):
            for routed in (False, True):
                rates[routed].append(round_rate(routed))
                print(f"{'with' if routed else 'without'} return_routed_experts: {rates[routed][-1]:.1f} tokens/s, "
                      f"{cpu[routed][-1]:.0f} server CPU us/token", flush=True)
    finally:
        server.stop()
    plain, routed = statistics.median(rates[False]), statistics.median(rates[True])
    plain_cpu, routed_cpu = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(f"median: {plain:.1f} tokens/s without, {routed:.1f} with: cost {100 * (1 - routed / plain):.2f}% of wall "
          f"throughput; server CPU {plain_cpu:.0f} vs {routed_cpu:.0f} us/token: {100 * (routed_cpu / plain_cpu - 1):.2f}% "
          f"more (B={args.batch}, P={args.prompt}, D={args.decode}, {args.rounds} rounds each, {args.device})")


if __name__ == "__main__":
    main()

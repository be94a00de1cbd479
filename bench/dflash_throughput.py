#!/usr/bin/env python3
"""Decode throughput of `beamline serve` with and without dflash speculative decoding, per batch size.

For each server configuration (no speculation; dflash with the given drafter and K verified in full; dflash with
adaptive verification, which verifies only the drafts that pay, possibly none) the model is served once, then for
each batch size B, B concurrent greedy /v1/completions requests are sent after a warm-up request: the model-turn
prompts of held-out conversations (the rendered Harmony prompt tokenized with `beamline tokenize --allow-special`),
each answered up to its end or D tokens. By default they are bench/data/beam-nano-v1-heldout-prompts.jsonl: the
first 300 held-out conversations of the v1 data generator (tools/data/generate.py at 90985e0, `--train 0 --heldout
1000 --seed 1`), the distribution models/beam-nano and models/beam-nano-drafter were trained on; today's generator
(v2) gives prompts on which the drafter accepts far less (bench/results/2026-12-02-spec2-adaptive-h200.md).
`--heldout none` sends a short text prompt and D output tokens (ignore_eos) instead, text the drafter was not
trained on. A prompt sent again (more requests than prompts) carries a cache_salt of its pass, so that it does not
hit the prefix cache of its earlier copy (a hit would recompute only the last token without a drafter and the
drafter's window with one, which favoured no speculation). Before each batch is measured, --warmup-rounds rounds of it
(other prompts) run unmeasured: the batch's decode graphs are recorded and adaptive verification's cost tables filled,
as in a server that has run a while. Output tokens per second = output tokens / wall time of the batch (prefills
included). The spec-decode
counters of /metrics (drafts, draft tokens, accepted) are read before and after each batch, so that each row shows its
mean tokens per drafted step (1 + accepted / drafts) and its acceptance rate. Prints a Markdown table.

With --phases every (configuration, batch) row gets a server of its own, run with BEAMLINE_STEP_PHASES=1, and the
engine's table of host wall time per step phase, plain steps against drafted ones (src/engine/step_phases.h), is
printed after the throughput table, with the runner's counts of recorded and replayed decode graphs and drafter
passes (each server's log is in --log-dir when given).

Usage: python3 bench/dflash_throughput.py BINARY --model DIR --drafter DIR [--k 7] [--batches 1,16] [--decode 256]
                                          [--heldout FILE|none] [--rounds R|R1,R2,..] [--warmup-rounds W]
                                          [--phases] [--log-dir DIR] [--device cuda] [--serve-args '...']
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request

PORT = 8124
V1_HELDOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "beam-nano-v1-heldout-prompts.jsonl")
PROMPTS = ["The weather in Paris today is", "Write a short story about a robot who", "List three facts about the moon:",
           "def fibonacci(n):", "Once upon a time, in a small village,", "The capital of Japan is",
           "Explain photosynthesis in simple words.", "My favourite recipe for pancakes is"]


def post(body):
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.load(response)


def counters():
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                     "vllm:spec_decode_num_accepted_tokens_total"):
            if line.startswith(name + " ") or line.startswith(name + "{"):
                values[name] = values.get(name, 0.0) + float(line.split()[-1])
    return values


# `batch` requests in flight at a time, `rounds` each in turn (different prompts), so that short answers still time
# many steps.
# `first`: the index of the first request's prompt (warm-up rounds take the prompts after the measured ones).
def run_batch(batch, decode, name, heldout=None, rounds=1, first=0):
    count = batch * rounds
    if heldout:
        bodies = [{"model": name, "prompt": heldout[i % len(heldout)], "max_tokens": decode, "temperature": 0,
                   "cache_salt": f"pass{i // len(heldout)}"} for i in range(first, first + count)]
    else:
        bodies = [{"model": name, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": decode, "temperature": 0,
                   "ignore_eos": True} for i in range(count)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=batch) as pool:
        results = list(pool.map(post, bodies))
    elapsed = time.perf_counter() - start
    return elapsed, sum(r["usage"]["completion_tokens"] for r in results)


def serve(args, speculative, log_path=None):
    command = [args.binary, "serve", "--model", args.model, "--device", args.device, "--port", str(PORT),
               "--max-num-seqs", str(max(args.batch_sizes)), "--speculative-config", speculative]
    command += args.serve_args.split()
    env = dict(os.environ)
    log = sys.stderr
    if log_path:
        env["BEAMLINE_STEP_PHASES"] = "1"
        log = open(log_path, "w")
    server = subprocess.Popen(command, stdout=log, stderr=log, env=env)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2):
                return server, command
        except OSError:
            if server.poll() is not None:
                sys.exit(f"beamline serve exited with {server.returncode}" + (f" (log: {log_path})" if log_path else ""))
            time.sleep(0.5)
    server.kill()
    sys.exit("beamline serve did not become healthy")


# The engine's step-phase table from a server log (logged when the engine closes), without the log prefixes.
def phase_table(log_path):
    lines, inside = [], False
    with open(log_path) as f:
        for line in f:
            if "step phases (host wall ms per step" in line:
                inside, lines = True, []
                continue
            if inside:
                if line.startswith("|"):
                    lines.append(line.rstrip("\n"))
                else:
                    inside = False
    return lines


def log_path_of(args, label, batch):
    return os.path.join(args.log_dir_used, f"serve-{label.split()[0]}-{label.split()[-1]}-b{batch}.log")


# The runner's "decode graphs: R recorded, P replayed" and "drafter passes: ..." lines from a server log.
def graph_counts(log_path):
    found = []
    with open(log_path) as f:
        for line in f:
            for what in ("decode graphs: ", "drafter passes: "):
                if what in line and "recorded," in line:
                    found.append(what + line.split(what, 1)[1].strip())
    return found or ["(no graph counts in the server log)"]


def measure(args, label, batch, name, heldout):
    rounds = args.rounds_of[batch]
    try:
        if args.warmup_rounds > 0:
            run_batch(batch, args.decode, name, heldout, args.warmup_rounds, first=batch * rounds)
    except OSError as error:
        print(f"{label}, batch {batch}, warm-up: {error}", file=sys.stderr)
    before = counters()
    try:
        elapsed, produced = run_batch(batch, args.decode, name, heldout, rounds)
    except OSError as error:  # a failed request: say so in the table, measure the other rows
        print(f"{label}, batch {batch}: {error}", file=sys.stderr)
        return (label + " (FAILED)", batch, 0, float("nan"), 0.0, 0.0, 0.0)
    after = counters()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return (label, batch, produced, elapsed, delta.get("vllm:spec_decode_num_drafts_total", 0.0),
            delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0),
            delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0))


def run_server(args, label, speculative, batches, name, heldout, log_path=None):
    server, command = serve(args, speculative, log_path)
    try:
        print(f"`{' '.join(command[1:])}`", file=sys.stderr)
        run_batch(1, 16, name)  # warm-up
        return [measure(args, label, batch, name, heldout) for batch in batches]
    finally:
        server.terminate()
        server.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binary")
    parser.add_argument("--model", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--decode", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--serve-args", default="")
    parser.add_argument("--rounds", default="1",
                        help="requests per concurrent slot, one after another: one count, or one per batch size")
    parser.add_argument("--warmup-rounds", type=int, default=1,
                        help="unmeasured rounds of each batch (other prompts) before it is measured")
    parser.add_argument("--heldout", default=V1_HELDOUT,
                        help="held-out conversations (jsonl with turns[].prompt): their prompts; 'none': text prompts "
                             "(default: the v1 generator's, which beam-nano and its drafter were trained on)")
    parser.add_argument("--phases", action="store_true",
                        help="a server per row with BEAMLINE_STEP_PHASES=1; print the step-phase tables")
    parser.add_argument("--log-dir", help="with --phases: keep each server's log here")
    args = parser.parse_args()
    args.batch_sizes = [int(b) for b in args.batches.split(",")]
    rounds = [int(r) for r in args.rounds.split(",")]
    if len(rounds) == 1:
        rounds *= len(args.batch_sizes)
    if len(rounds) != len(args.batch_sizes):
        sys.exit(f"--rounds: {len(rounds)} counts for {len(args.batch_sizes)} batch sizes")
    args.rounds_of = dict(zip(args.batch_sizes, rounds))
    if args.heldout == "none":
        args.heldout = None
    heldout = None
    if args.heldout:
        prompts = []
        with open(args.heldout) as f:
            for line in f:
                prompts += [turn["prompt"] for turn in json.loads(line)["turns"]]
                if len(prompts) >= max(b * (args.rounds_of[b] + args.warmup_rounds) for b in args.batch_sizes):
                    break
        encoded = subprocess.run([args.binary, "tokenize", "--model", args.model, "--allow-special", "--jsonl"],
                                 input="".join(json.dumps(p) + "\n" for p in prompts), capture_output=True, text=True,
                                 check=True).stdout
        heldout = [[int(t) for t in line.split()] for line in encoded.splitlines() if line.strip()]
    name = args.model.rstrip("/").split("/")[-1]
    configs = [("none", "none")]
    for adaptive in (False, True):
        configs.append((f"dflash K={args.k} {'adaptive' if adaptive else 'fixed'}",
                        json.dumps({"method": "dflash", "model": args.drafter, "num_speculative_tokens": args.k,
                                    "adaptive_verification": adaptive})))
    rows, phases = [], []
    args.log_dir_used = args.log_dir or (os.environ.get("TMPDIR", "/tmp") if args.phases else None)
    for label, speculative in configs:
        if not args.phases:
            rows += run_server(args, label, speculative, args.batch_sizes, name, heldout)
            continue
        for batch in args.batch_sizes:
            log_path = log_path_of(args, label, batch)
            rows += run_server(args, label, speculative, [batch], name, heldout, log_path)
            phases.append((label, batch, phase_table(log_path)))
    what = (f"requests per slot: {', '.join(f'{args.rounds_of[b]} at batch {b}' for b in args.batch_sizes)} "
            f"(after {args.warmup_rounds} unmeasured), ")
    what += f"held-out prompts of {args.heldout}, up to {args.decode}" if heldout else f"text prompts, {args.decode}"
    print(f"\nmodel {args.model}, drafter {args.drafter}, greedy, {what} output tokens per request, "
          f"device {args.device}\n")
    print("| speculation | batch | output tokens | wall s | output tokens/s | vs none | drafts | draft tokens per draft "
          "| tokens per drafted step | acceptance |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    plain = {batch: produced / elapsed for label, batch, produced, elapsed, *_ in rows if label == "none"}
    for label, batch, produced, elapsed, drafts, accepted, draft_tokens in rows:
        per_step = f"{1 + accepted / drafts:.2f}" if drafts else "-"
        rate = f"{accepted / draft_tokens:.3f}" if draft_tokens else "-"
        per_draft = f"{draft_tokens / drafts:.2f}" if drafts else "-"
        speedup = produced / elapsed / plain[batch] if batch in plain else float("nan")
        print(f"| {label} | {batch} | {produced} | {elapsed:.2f} | {produced / elapsed:.0f} | {speedup:.2f}x "
              f"| {drafts:.0f} | {per_draft} | {per_step} | {rate} |")
    for label, batch, table in phases:
        print(f"\nstep phases, {label}, batch {batch} (host wall ms per step, server with BEAMLINE_STEP_PHASES=1; "
              "the warm-up requests included)\n")
        print("\n".join(table) if table else "(no table in the server log)")
        print("\n" + "; ".join(graph_counts(log_path_of(args, label, batch))))


if __name__ == "__main__":
    main()

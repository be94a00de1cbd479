#!/usr/bin/env python3
"""Per-kernel device time of one decode step of `beamline serve`, per batch size, from an Nsight Systems trace.

Serves MODEL_DIR (`--load-format dummy`) under `nsys launch` (CUDA trace, graph nodes traced one by one) and, per batch
size B, does what bench/serve_throughput.py does (a prefill run, then B streamed requests of P prompt tokens and D
decode steps), recording only the streamed run (`nsys start` / `nsys stop`). The recorded kernels are cut into steps at
each embedding launch (a step's first kernel); the decode step is the kernel sequence that repeats most often (the
replays of the decode graph of B rows). Prints, per B, a Markdown table: each kernel's launches and device µs per step,
the step's kernel time against its span (first kernel start to last kernel end: the rest is gaps between kernels).
Writes each trace (nsys-rep) and its kernel list (CSV) to --out.

Usage: python3 bench/decode_step_profile.py BINARY MODEL_DIR --out DIR [--batches 1,16,64] [--prompt 8192]
                                            [--decode 64] [--nsys PATH] [--serve-args '...']
"""
import argparse
import collections
import csv
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_throughput  # noqa: E402  (its request helpers, on a port of our own)

serve_throughput.PORT = 8124
SESSION = f"decode-step-{os.getpid()}"


def nsys_command(nsys, *args, timeout=300):
    result = subprocess.run([nsys, *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        sys.exit(f"decode_step_profile: nsys {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def kernel_rows(nsys, report):
    """(name, start ns, duration ns) of every kernel of the report, in start order."""
    text = nsys_command(nsys, "stats", "--report", "cuda_gpu_trace", "--format", "csv", "--output", "-",
                        "--force-export=true", report)
    lines = text[text.find('"Start'):] if '"Start' in text else text[text.find("Start"):]
    rows = []
    for row in csv.DictReader(io.StringIO(lines)):
        name = row.get("Name", "")
        # Memory copies and sets are rows of this report too; kernels are the rows with a grid.
        if not row.get("GrdX") or name.startswith("[CUDA"):
            continue
        rows.append((name, int(float(row["Start (ns)"])), int(float(row["Duration (ns)"]))))
    rows.sort(key=lambda r: r[1])
    return rows


def short_name(name):
    """A demangled kernel name without return type, namespaces, template and function arguments."""
    name = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    for mark in "<(":
        name = name.split(mark)[0]
    return name.split("::")[-1]


def decode_steps(rows):
    """The steps whose kernel sequence repeats most often, as lists of rows."""
    steps, current = [], []
    for row in rows:
        if short_name(row[0]).startswith("embedding") and current:
            steps.append(current)
            current = []
        current.append(row)
    if current:
        steps.append(current)
    signatures = collections.Counter(tuple(short_name(r[0]) for r in step) for step in steps)
    if not signatures:
        return []
    common, _ = signatures.most_common(1)[0]
    return [step for step in steps if tuple(short_name(r[0]) for r in step) == common]


def step_table(batch, steps):
    if not steps:
        return f"\nbatch {batch}: no decode step found in the trace\n"
    count = len(steps)
    per_kernel = collections.OrderedDict()
    for step in steps:
        for name, _, duration in step:
            entry = per_kernel.setdefault(short_name(name), [0, 0.0])
            entry[0] += 1
            entry[1] += duration / 1e3
    spans = [(step[-1][1] + step[-1][2] - step[0][1]) / 1e3 for step in steps]
    busy = [sum(r[2] for r in step) / 1e3 for step in steps]
    span, kernels = statistics.median(spans), statistics.median(busy)
    out = [f"\nbatch {batch}: {count} decode steps of {len(steps[0])} kernels; per step (median) {span:.1f} µs from "
           f"the first kernel's start to the last one's end, {kernels:.1f} µs in kernels, {span - kernels:.1f} µs "
           f"between them\n",
           "| kernel | launches per step | µs per step | µs each | share of kernel time |",
           "| --- | --- | --- | --- | --- |"]
    total = sum(entry[1] for entry in per_kernel.values()) / count
    for name, (launches, us) in sorted(per_kernel.items(), key=lambda item: -item[1][1]):
        out.append(f"| {name} | {launches // count} | {us / count:.1f} | {us / launches:.2f} | "
                   f"{100 * us / count / total:.1f}% |")
    out.append(f"| all | {sum(e[0] for e in per_kernel.values()) // count} | {total:.1f} | | 100% |")
    return "\n".join(out)


def wait_for_server(server):
    deadline = time.time() + 600
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{serve_throughput.PORT}/health", timeout=2):
                return
        except OSError:
            # `nsys launch` may return 0 once the server runs under the session; anything else is a failure.
            if server.poll() not in (None, 0) or time.time() > deadline:
                sys.exit("decode_step_profile: the server did not start")
            time.sleep(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary")
    parser.add_argument("model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt", type=int, default=8192)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--nsys", default=shutil.which("nsys") or "nsys")
    parser.add_argument("--serve-args", default="", help="more flags for beamline serve, space-separated")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    vocab = json.load(open(f"{args.model}/config.json"))["vocab_size"]
    name = os.path.basename(os.path.normpath(args.model))
    batches = [int(b) for b in args.batches.split(",")]
    step_tokens = 8192
    prefill_steps = {batch: -(-batch * args.prompt // step_tokens) for batch in batches}
    serve = [args.binary, "serve", "--model", args.model, "--load-format", "dummy", "--device", "cuda",
             "--port", str(serve_throughput.PORT), "--gpu-memory-utilization", "0.95",
             "--max-num-seqs", str(max(batches)),
             "--max-model-len", str(args.prompt + args.decode + max(prefill_steps.values()) + 16),
             "--max-num-batched-tokens", str(step_tokens)] + args.serve_args.split()
    server = subprocess.Popen([args.nsys, "launch", f"--session-new={SESSION}", "--trace=cuda",
                               "--cuda-graph-trace=node", *serve], stdout=sys.stderr, stderr=sys.stderr)
    # A SIGTERM (a caller's timeout) ends this script through the finally below, so that the session and server go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("decode_step_profile: terminated"))
    reports = {}
    try:
        wait_for_server(server)
        serve_throughput.run_batch(1, 64, 4, vocab, 0, name)  # warm-up, as serve_throughput
        for batch in batches:
            serve_throughput.run_batch(batch, args.prompt, 1, vocab, batch, name)
            report = os.path.join(args.out, f"decode-b{batch}")
            nsys_command(args.nsys, "start", f"--session={SESSION}", f"--output={report}", "--force-overwrite=true")
            serve_throughput.run_streamed(batch, args.prompt, 2 + args.decode + prefill_steps[batch], vocab,
                                          batch + 1000, name)
            nsys_command(args.nsys, "stop", f"--session={SESSION}")
            reports[batch] = report + ".nsys-rep"
    finally:
        subprocess.run([args.nsys, "shutdown", f"--session={SESSION}", "--kill=sigterm"], capture_output=True,
                       timeout=120)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"\n`{' '.join(serve[1:])}` under `nsys launch --trace=cuda --cuda-graph-trace=node`; prompt {args.prompt} "
          f"tokens, {args.decode} decode steps recorded per batch (kernel times under the tracer)")
    for batch, report in reports.items():
        rows = kernel_rows(args.nsys, report)
        with open(os.path.join(args.out, f"decode-b{batch}-kernels.csv"), "w") as f:
            f.write("name,start_ns,duration_ns\n")
            f.writelines(f'"{n}",{s},{d}\n' for n, s, d in rows)
        print(step_table(batch, decode_steps(rows)), flush=True)


if __name__ == "__main__":
    main()

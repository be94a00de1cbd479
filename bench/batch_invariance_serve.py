#!/usr/bin/env python3
"""Issue 20's batch-invariance check and its cost, served: one temperature-0 prompt asked alone (batch 1) and then
--completions times, each copy among random concurrent requests (tools/reference/check_batch_invariance.py's load), on
a server with --batch-invariant and on one without; how many copies are identical to the batch-1 answer (token ids and
the logprobs of the token and its top 5, bit for bit) and how many distinct answers each mode gave. Then the price of
the mode: `beamline bench serve` output tokens/s of the same random load on both servers (--rounds runs each,
alternating, the median kept).

  python3 bench/batch_invariance_serve.py BEAMLINE [--model models/beam-nano] [--device cuda] [--completions 1000]
          [--out DIR]

Speculative decoding is off (--speculative-config none) in both servers. Writes DIR/batch_invariance_serve.md and
.json, prints the table; exits 1 when the mode gives a copy that differs from the batch-1 answer.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
from beamline_server import Server, bench_serve_throughput  # noqa: E402
from check_batch_invariance import invariance_answers  # noqa: E402

MODES = {"batch-invariant": ["--batch-invariant"], "default": []}


def serve(args, mode):
    flags = ["--speculative-config", "none", "--max-num-seqs", str(args.max_num_seqs),
             "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--seed", "0"] + MODES[mode]
    return Server(args.beamline, args.model, args.device, flags, max_model_len=1024, kv_cache_memory=args.kv_cache_memory)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("beamline")
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "beam-nano"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--completions", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens of each copy of the prompt")
    parser.add_argument("--workers", type=int, default=16, help="threads that keep the invariance load in flight")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=256,
                        help="small, so that prompts are split into chunks that share steps with decodes")
    parser.add_argument("--kv-cache-memory", default="2G")
    parser.add_argument("--prompts", type=int, default=512, help="bench serve prompts per throughput run")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="throughput runs per mode, alternating")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    name = os.path.basename(os.path.normpath(args.model))
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(args.seed)
    prompt = [rng.randrange(100, min(vocab, 3000)) for _ in range(37)]

    results = {mode: {"tokens_per_s": []} for mode in MODES}
    for mode in MODES:
        server = serve(args, mode)
        try:
            started = time.time()
            alone, answers = invariance_answers(server, name, prompt, args.completions, args.seed, args.max_tokens,
                                                args.workers, vocab=min(vocab, 3000))
            ids = [json.loads(a)["ids"] for a in answers]
            alone_ids = json.loads(alone)["ids"]
            results[mode].update(identical=sum(a == alone for a in answers), distinct=len(set([alone] + answers)),
                                 same_tokens=sum(i == alone_ids for i in ids),
                                 distinct_tokens=len({tuple(i) for i in ids + [alone_ids]}),
                                 seconds=time.time() - started)
            print(f"{mode}: {results[mode]['identical']} of {len(answers)} copies identical to the batch-1 answer "
                  f"({results[mode]['same_tokens']} with its tokens), {results[mode]['distinct']} distinct "
                  f"({results[mode]['distinct_tokens']} token sequences) ({results[mode]['seconds']:.0f} s)", flush=True)
        finally:
            server.stop()
    for _ in range(args.rounds):
        for mode in MODES:
            server = serve(args, mode)
            try:
                results[mode]["tokens_per_s"].append(bench_serve_throughput(
                    args.beamline, server.base, args.prompts, args.input_len, args.output_len, args.concurrency,
                    args.timeout))
            finally:
                server.stop()
    for mode in MODES:
        results[mode]["median_tokens_per_s"] = statistics.median(results[mode]["tokens_per_s"])
    invariant, default = results["batch-invariant"], results["default"]
    cost = 1 - invariant["median_tokens_per_s"] / default["median_tokens_per_s"]

    lines = [
        f"{name} on {args.device}: {args.completions} temperature-0 completions of one {len(prompt)}-token prompt "
        f"({args.max_tokens} tokens each) under random concurrent load ({args.workers} threads, 1-6 other requests "
        f"per copy, half the copies with their own cache_salt), `--max-num-seqs {args.max_num_seqs} "
        f"--max-num-batched-tokens {args.max_num_batched_tokens} --speculative-config none`",
        "",
        "| mode | identical to batch 1 (tokens and logprobs) | its tokens only | distinct answers (token sequences) "
        "| throughput, output tok/s (median of runs) | runs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode in MODES:
        r = results[mode]
        lines.append(f"| {mode} | {r['identical']} / {args.completions} | {r['same_tokens']} / {args.completions} | "
                     f"{r['distinct']} ({r['distinct_tokens']}) | "
                     f"{r['median_tokens_per_s']:.1f} | {', '.join(f'{v:.1f}' for v in r['tokens_per_s'])} |")
    lines += ["",
              f"Throughput: `beamline bench serve`, {args.prompts} random prompts of {args.input_len} ids, "
              f"{args.output_len} tokens each, concurrency {args.concurrency}. The mode costs {100 * cost:.1f}% of "
              f"the default's output tokens/s.",
              f"Goal (issue 20): with the mode exactly one distinct answer: "
              f"{'pass' if invariant['distinct'] == 1 else 'FAIL'}."]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "batch_invariance_serve.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "batch_invariance_serve.json"), "w") as f:
        json.dump({"args": vars(args), "results": results, "cost": cost}, f, indent=1)
    print(table)
    if invariant["distinct"] != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()

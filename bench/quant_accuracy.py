#!/usr/bin/env python3
"""Accuracy of beam-nano quantized to FP8 (block 128), MXFP8 and NVFP4 against its BF16 checkpoint, through the C++
engine on the CPU. Pure Python 3.

For each format: `beamline quantize` writes the checkpoint (and FP8 weights also run with --kv-cache-dtype fp8), then
  - held-out scores by category: greedy completions of the held-out turns (tools/train/eval_engine.py's loop:
    `beamline generate`, scored by harmony_check.py) on a fixed subset: the first --conversations conversations of
    `tools/data/generate.py --train 0 --heldout 1000 --seed 1`; and how many completions are token for token BF16's;
  - mean per-token KL(BF16 || quantized) of teacher-forced logits (`beamline logits`, one prefill) over the first
    --kl-turns turns, each the turn's prompt followed by the BF16 model's own completion, every position counted.

  python3 bench/quant_accuracy.py --beamline build/apps/beamline/beamline [--conversations 200] [--kl-turns 30]
      [--json out.json]
"""
import argparse
import array
import ast
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
from eval_engine import encode, evaluate, load_turns, run  # noqa: E402

FORMATS = ["fp8", "mxfp8", "nvfp4"]
FP8_KV = ["--kv-cache-dtype", "fp8"]


def read_npy_f32(path):
    """(rows, columns, flat float32 array) of a 2-D little-endian float32 .npy."""
    with open(path, "rb") as f:
        data = f.read()
    header_length = int.from_bytes(data[8:10], "little")
    header = ast.literal_eval(data[10:10 + header_length].decode("latin1"))
    if header["descr"] != "<f4" or header["fortran_order"] or len(header["shape"]) != 2:
        sys.exit(f"{path}: expected a C-order float32 matrix, got {header}")
    values = array.array("f")
    values.frombytes(data[10 + header_length:])
    return header["shape"][0], header["shape"][1], values


def log_softmax(row):
    top = max(row)
    total = math.log(sum(math.exp(v - top) for v in row)) + top
    return [v - total for v in row]


def mean_kl(reference_path, quantized_path):
    """Sum and count of KL(p || q) over the positions of two [T, V] logit files."""
    rows, columns, p_values = read_npy_f32(reference_path)
    _, _, q_values = read_npy_f32(quantized_path)
    total = 0.0
    for t in range(rows):
        log_p = log_softmax(p_values[t * columns:(t + 1) * columns])
        log_q = log_softmax(q_values[t * columns:(t + 1) * columns])
        total += sum(math.exp(a) * (a - b) for a, b in zip(log_p, log_q))
    return total, rows


def category_scores(results):
    """{kind: [passed, total]} and the overall figure."""
    by_kind = {}
    for r in results:
        entry = by_kind.setdefault(r["kind"], [0, 0])
        entry[0] += bool(r["ok"])
        entry[1] += 1
    by_kind["all"] = [sum(bool(r["ok"]) for r in results), len(results)]
    return by_kind


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "beam-nano"))
    parser.add_argument("--conversations", type=int, default=200, help="the first N held-out conversations")
    parser.add_argument("--kl-turns", type=int, default=30, help="turns whose logits are compared")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    in_work_dir("quant-accuracy-", lambda work: measure(args, work))


def in_work_dir(prefix, body):
    """body(work) with `work` a fresh temporary directory, removed afterwards."""
    work = tempfile.mkdtemp(prefix=prefix)
    try:
        body(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def heldout_turns(work, conversations):
    """(kind, prompt, check) of every model turn of the first `conversations` held-out conversations
    (tools/data/generate.py --heldout 1000 --seed 1, written under `work`)."""
    run([sys.executable, os.path.join(ROOT, "tools", "data", "generate.py"), "--out", work, "--train", "0",
         "--heldout", "1000", "--seed", "1"])
    return load_turns(os.path.join(work, "heldout.jsonl"), conversations)


def measure(args, work):
    """Quantizes, evaluates and prints the tables, with every file under `work`."""
    turns = heldout_turns(work, args.conversations)
    encoded = encode(args.beamline, args.model, [prompt for _, prompt, _ in turns])
    variants = {"bf16": (args.model, [])}  # name: (checkpoint, extra flags of generate and logits)
    for name in FORMATS:
        variants[name] = (os.path.join(work, name), [])
        run([args.beamline, "quantize", "--model", args.model, "--out", variants[name][0], "--quantization", name])
    variants["fp8 + fp8 KV"] = (variants["fp8"][0], FP8_KV)
    models = list(variants)

    figures = {}
    reference = None
    for index_of_variant, (name, (model, extra)) in enumerate(variants.items()):
        started = time.time()
        results = evaluate(args.beamline, model, turns, encoded, args.max_tokens, extra=extra)
        figures[name] = {"scores": category_scores(results), "generate_seconds": round(time.time() - started, 1)}
        if reference is None:
            reference = results
        # A finer figure than the scores: turns whose greedy completion is token for token BF16's.
        figures[name]["same_as_bf16"] = sum(r["generated"] == b["generated"] for r, b in zip(results, reference))
        kl_sum, kl_count = 0.0, 0
        for index in range(min(args.kl_turns, len(turns))):
            sequence = encoded[index] + reference[index]["generated"]
            tokens = ",".join(map(str, sequence))
            logits = os.path.join(work, f"{index_of_variant}-{index}.npy")
            run([args.beamline, "logits", "--model", model, "--tokens", tokens, "--out", logits, "--device", "cpu",
                 *extra])
            if name != "bf16":
                total, count = mean_kl(os.path.join(work, f"0-{index}.npy"), logits)
                kl_sum, kl_count = kl_sum + total, kl_count + count
        if name != "bf16":
            figures[name]["mean_kl"] = kl_sum / kl_count
            figures[name]["kl_positions"] = kl_count
        print(f"{name}: {figures[name]}", flush=True)

    kinds = sorted(figures["bf16"]["scores"], key=lambda k: (k == "all", k))
    print(f"\n{len(turns)} turns of the first {args.conversations} held-out conversations")
    print("| category | turns | " + " | ".join(models) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in models) + " |")
    for kind in kinds:
        total = figures["bf16"]["scores"][kind][1]
        cells = [f"{100.0 * figures[m]['scores'][kind][0] / total:.1f}%" for m in models]
        print(f"| {kind} | {total} | " + " | ".join(cells) + " |")
    print("| mean KL(BF16 ‖ q) per token | | — | " + " | ".join(f"{figures[m]['mean_kl']:.2e}" for m in models[1:]) + " |")
    print(f"| completions token for token BF16's | {len(turns)} | — | " +
          " | ".join(str(figures[m]["same_as_bf16"]) for m in models[1:]) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The FP8 KV cache's per-tensor scales on beam-nano, on the CPU: mean per-token KL(F32 KV || FP8 KV) with scale 1.0,
with --calculate-kv-scales (vLLM's k_scale = max|k| / 200, v_scale = max|v| / 100 from the first step) and with
scales stored in the checkpoint (self_attn.k_scale / v_scale), on beam-nano as trained and on two copies whose K and V
are 1024 times larger or smaller. Pure Python 3.

A copy at factor f has every layer's k_proj and v_proj times f and q_proj and o_proj over f (powers of two: exact in
BF16 but for values driven out of BF16's range): the same function, as the F32 KV column's KL against f = 1 shows, with
K and V of magnitude f. Its checkpoint-scales variant stores k_scale = v_scale = f (the original model's codes).
Teacher-forced logits (`beamline logits`, one prefill) over the first --kl-turns held-out turns, each the turn's prompt
followed by beam-nano's own greedy completion (F32 KV), every position counted.

  python3 bench/kv_scales_accuracy.py --beamline build/apps/beamline/beamline [--kl-turns 20] [--json out.json]
"""
import argparse
import array
import json
import os
import shutil
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from eval_engine import encode, run  # noqa: E402
from quant_accuracy import heldout_turns, in_work_dir, mean_kl  # noqa: E402

FACTORS = [("x1", 0), ("x1024", 10), ("x1/1024", -10)]  # name, log2 of the factor
PROJECTIONS = {"q_proj": -1, "k_proj": 1, "v_proj": 1, "o_proj": -1}  # sign of the exponent each is scaled by


def bf16_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def float_to_bf16(value):
    """Round to nearest even (finite inputs)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def scale_bf16(data, shift):
    """BF16 bytes times 2^shift: the exponent moved where the result stays normal, else through float."""
    values = array.array("H")
    values.frombytes(data)
    for i, bits in enumerate(values):
        exponent = (bits >> 7) & 0xFF
        if exponent == 0 and bits & 0x7FFF == 0:
            continue  # zero
        if 0 < exponent and 0 < exponent + shift < 255:
            values[i] = bits + (shift << 7)
        else:
            values[i] = float_to_bf16(bf16_to_float(bits) * 2.0 ** shift)
    return values.tobytes()


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    return header, data[8 + length:]


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)} in order."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def scaled_copy(model, out, shift, with_scales):
    """beam-nano with K and V times 2^shift (q and o over it); with_scales adds k_scale = v_scale = 2^shift."""
    shutil.copytree(model, out)
    header, data = read_safetensors(os.path.join(model, "model.safetensors"))
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        blob = data[begin:end]
        projection = name.split(".")[-2] if name.endswith(".weight") else ""
        if ".self_attn." in name and projection in PROJECTIONS and shift != 0:
            if entry["dtype"] != "BF16":
                sys.exit(f"{name}: expected BF16, found {entry['dtype']}")
            blob = scale_bf16(blob, PROJECTIONS[projection] * shift)
        tensors[name] = (entry["dtype"], entry["shape"], blob)
    if with_scales:
        layers = json.load(open(os.path.join(model, "config.json")))["num_hidden_layers"]
        for layer in range(layers):
            for which in ("k_scale", "v_scale"):
                tensors[f"model.layers.{layer}.self_attn.{which}"] = ("F32", [], struct.pack("<f", 2.0 ** shift))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", required=True)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "beam-nano"))
    parser.add_argument("--kl-turns", type=int, default=20, help="held-out turns whose logits are compared")
    parser.add_argument("--max-tokens", type=int, default=200, help="of each turn's greedy completion")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    in_work_dir("kv-scales-", lambda work: measure(args, work))


def measure(args, work):
    turns = heldout_turns(work, args.kl_turns)[:args.kl_turns]
    prompts = encode(args.beamline, args.model, [prompt for _, prompt, _ in turns])
    sequences = []
    for ids in prompts:
        output = run([args.beamline, "generate", "--model", args.model, "--tokens", ",".join(map(str, ids)),
                      "--max-tokens", str(args.max_tokens), "--device", "cpu", "--kv-cache-dtype", "float32"])
        lines = [line for line in output.splitlines() if line.strip() and set(line.strip()) <= set("0123456789, ")]
        generated = [int(t) for t in lines[-1].replace(",", " ").split()] if lines else []
        sequences.append(ids + generated)

    def logits(model, flags, path):
        for index, sequence in enumerate(sequences):
            run([args.beamline, "logits", "--model", model, "--tokens", ",".join(map(str, sequence)),
                 "--out", f"{path}-{index}.npy", "--device", "cpu", *flags])

    def kl(reference, other):
        total, count = 0.0, 0
        for index in range(len(sequences)):
            t, c = mean_kl(f"{reference}-{index}.npy", f"{other}-{index}.npy")
            total, count = total + t, count + c
        return total / count, count

    fp8 = ["--kv-cache-dtype", "fp8"]
    variants = [("FP8 KV, scale 1.0", fp8, False),
                ("FP8 KV, --calculate-kv-scales", fp8 + ["--calculate-kv-scales"], False),
                ("FP8 KV, checkpoint scales", fp8, True)]
    figures = {}
    original = os.path.join(work, "logits-0-f32")  # the x1 reference
    for name, shift in FACTORS:
        started = time.time()
        model = os.path.join(work, f"model-{shift}")
        with_scales = os.path.join(work, f"model-{shift}-scales")
        if shift == 0:
            model = args.model
        else:
            scaled_copy(args.model, model, shift, False)
        scaled_copy(args.model, with_scales, shift, True)
        reference = os.path.join(work, f"logits-{shift}-f32")
        logits(model, ["--kv-cache-dtype", "float32"], reference)
        row = {}
        if shift != 0:
            row["F32 KV against x1 F32 KV"], positions = kl(original, reference)
        for label, flags, checkpoint_scales in variants:
            path = os.path.join(work, f"logits-{shift}-{len(row)}")
            logits(with_scales if checkpoint_scales else model, flags, path)
            row[label], positions = kl(reference, path)
        row["positions"] = positions
        row["seconds"] = round(time.time() - started, 1)
        figures[name] = row
        print(f"{name}: {row}", flush=True)

    columns = ["FP8 KV, scale 1.0", "FP8 KV, --calculate-kv-scales", "FP8 KV, checkpoint scales",
               "F32 KV against x1 F32 KV"]
    positions = figures["x1"]["positions"]
    print(f"\nmean per-token KL(F32 KV || variant) over {positions} positions of {len(sequences)} turns")
    print("| K, V magnitude | " + " | ".join(columns) + " |")
    print("| --- | " + " | ".join("---" for _ in columns) + " |")
    for name, _ in FACTORS:
        cells = [f"{figures[name][c]:.2e}" if c in figures[name] else "—" for c in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()

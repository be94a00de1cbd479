#!/usr/bin/env python3
"""Issue 20's served MoE LoRA throughput: beam-nano served with 8 adapters, each request naming one of them
(`beamline bench serve --lora-modules`, vLLM's), at --concurrency against the base model served without
--enable-lora; the experts' adapters at their true rank (r / top_k, a rank_pattern entry, as Megatron-Bridge's
normalize_moe_lora writes them) against the same adapters zero-padded to r (what a kernel without per-module ranks
needs; B scaled by r / own so that both compute the same delta), and the device memory the loaded adapters hold in
each server (memory that a padded layout takes from the KV cache).

  python3 bench/lora_serve_throughput.py BEAMLINE [--device cuda] [--rank 16] [--concurrency 64] [--prompts 512]

Speculative decoding is off in every server (--enable-lora does not combine with it). Prints a markdown table.
"""
import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import safetensors_io  # noqa: E402
from beamline_server import Server, bench_serve_throughput  # noqa: E402
from check_lora import write_adapter  # noqa: E402

ADAPTERS = 8
MODULE = re.compile(r"\.(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.)?(gate|up|down)_proj)\.weight$")


def padded_copy(source, target, adapter, rank):
    """`source`'s adapter with every expert module zero-padded to `rank` (B scaled by rank / own: the same delta)."""
    os.makedirs(target)
    with open(os.path.join(source, "adapter_config.json")) as f:
        config = json.load(f)
    del config["rank_pattern"]  # every module at r
    with open(os.path.join(target, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    out = {}
    for module, (a, b, _) in adapter.items():
        own = a.shape[0]
        a_pad = np.zeros((rank, a.shape[1]), np.float32)
        b_pad = np.zeros((b.shape[0], rank), np.float32)
        a_pad[:own] = a
        b_pad[:, :own] = b * (rank / own)
        out[f"base_model.model.{module}.lora_A.weight"] = safetensors_io.Tensor("F32", a_pad)
        out[f"base_model.model.{module}.lora_B.weight"] = safetensors_io.Tensor("F32", b_pad)
    safetensors_io.save(os.path.join(target, "adapter_model.safetensors"), out)


def bench(args, server, lora_names):
    extra = ["--lora-modules", *lora_names] if lora_names else []
    return bench_serve_throughput(args.beamline, server.base, args.prompts, args.input_len, args.output_len,
                                  args.concurrency, args.timeout, extra)


def adapter_mib(log):
    held = re.findall(r"the loaded adapters hold ([\d.]+) MiB", log)
    return float(held[-1]) if held else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("beamline")
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "beam-nano"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--kv-cache-memory", default="2G")
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()

    tensors = safetensors_io.load_checkpoint_tensors(args.model)
    modules = sorted(name[:-len(".weight")] for name in tensors if MODULE.search(name))
    with open(os.path.join(args.model, "config.json")) as f:
        top_k = json.load(f)["num_experts_per_tok"]
    expert_rank = max(1, args.rank // top_k)
    rng = np.random.default_rng(7)
    common = ["--speculative-config", "none", "--max-num-seqs", str(args.concurrency)]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        layouts = {"true rank": [], "padded": []}
        for i in range(ADAPTERS):
            true_dir = os.path.join(scratch, f"true{i}")
            adapter = write_adapter(true_dir, {m + ".weight": tensors[m + ".weight"].to_float32() for m in modules},
                                    modules, args.rank, 2 * args.rank, False, rng, expert_rank=expert_rank)
            padded_copy(true_dir, os.path.join(scratch, f"padded{i}"), adapter, args.rank)
            layouts["true rank"].append(f"a{i}={true_dir}")
            layouts["padded"].append(f"a{i}={os.path.join(scratch, f'padded{i}')}")
        names = [f"a{i}" for i in range(ADAPTERS)]
        configs = [("base model, no --enable-lora", common, [])]
        for layout, modules_flag in layouts.items():
            configs.append((f"{ADAPTERS} adapters, experts {layout}",
                            common + ["--enable-lora", "--max-loras", str(ADAPTERS), "--max-lora-rank", str(args.rank),
                                      "--lora-modules", *modules_flag], names))
        for label, extra, lora_names in configs:
            server = Server(args.beamline, args.model, args.device, extra, max_model_len=1024,
                            kv_cache_memory=args.kv_cache_memory)
            try:
                throughput = bench(args, server, lora_names)
            finally:
                server.stop()
            rows.append((label, throughput, adapter_mib(server.log)))
    base = rows[0][1]
    print(f"beam-nano on {args.device}: {args.prompts} requests of {args.input_len} random tokens -> {args.output_len} "
          f"(ignore_eos), --max-concurrency {args.concurrency}; adapters of rank {args.rank} on attention and the dense "
          f"MLP, experts at {expert_rank} (true) or padded to {args.rank}; each request names one of {ADAPTERS} "
          "at random\n")
    print("| server | output tokens/s | vs base | adapters' device memory (MiB) |")
    print("| --- | --- | --- | --- |")
    for label, throughput, mib in rows:
        print(f"| {label} | {throughput:.0f} | {throughput / base:.2f}x | {'-' if mib is None else f'{mib:.1f}'} |")
    true_rank, padded = rows[1][1], rows[2][1]
    print(f"\ntrue rank against padded: {true_rank / padded:.2f}x the output tokens/s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch peers of `backend_ops perf attention`: the same rows timed with SDPA (contiguous, unpaged BF16 K/V,
GQA 48/8 x 128) and, for the prefill rows, flex_attention (compiled, causal or sliding-window block mask).
Prints the same Markdown table (ms, bytes or FLOPs, achieved, floor, % of floor). Runs on the GPU machine.

Usage: python3 bench/torch_attention_peers.py [--iterations N] [--repeats R] [--no-flex] [--flex-filter TEXT]
"""
import argparse
import math

import torch
import torch.nn.functional as F

HBM = 4.8e12
BF16_FLOPS = 758e12
HEADS, KV_HEADS, DIM, WINDOW = 48, 8, 128, 512
ROTATION_BYTES = 512e6  # K/V sets below L2-defeating size are replicated and used in turn

CASES = [  # name, batch, cached, added, window
    ("decode global B=1 L=8K", 1, 8191, 1, 0),
    ("decode global B=1 L=128K", 1, 131071, 1, 0),
    ("decode global B=32 L=8K", 32, 8191, 1, 0),
    ("decode global B=128 L=4K", 128, 4095, 1, 0),
    ("decode window-512 B=1 L=8K", 1, 8191, 1, WINDOW),
    ("decode window-512 B=128 L=4K", 128, 4095, 1, WINDOW),
    ("prefill causal 8K tokens", 1, 0, 8192, 0),
    ("prefill window-512 32K tokens", 1, 0, 32768, WINDOW),
]


def time_ms(fn, iterations, repeats):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iterations):
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / repeats)
    samples.sort()
    return samples[len(samples) // 2]


def visible_pairs(cached, added, window):
    total = 0
    for i in range(added):
        p = cached + i
        total += min(p + 1, window) if window else p + 1
    return total


def row(name, ms, decode, kv_bytes, flops):
    if decode:
        floor = kv_bytes / HBM * 1e3
        return f"| {name} | {ms:.4f} | {kv_bytes / 1e6:.1f} MB | {kv_bytes / (ms * 1e-3) / 1e12:.2f} TB/s | {floor:.4f} | {100 * floor / ms:.0f}% |"
    floor = flops / BF16_FLOPS * 1e3
    return f"| {name} | {ms:.3f} | {flops / 1e9:.1f} GFLOP | {flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s | {floor:.3f} | {100 * floor / ms:.1f}% |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-flex", action="store_true", help="skip flex_attention (it compiles per shape)")
    parser.add_argument("--flex-filter", default="",
                        help="flex_attention only for the prefill cases whose name contains this (each compiles)")
    args = parser.parse_args()
    torch.manual_seed(1)
    device = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("\n| case | ms | bytes or FLOPs | achieved | floor ms | % of floor |\n| --- | --- | --- | --- | --- | --- |")
    for name, batch, cached, added, window in CASES:
        decode = added == 1
        length = cached + added
        keys = min(length, window) if window else length
        kv_bytes = batch * keys * KV_HEADS * DIM * 2 * 2
        flops = 4 * DIM * HEADS * batch * visible_pairs(cached, added, window)
        q = torch.randn(batch, HEADS, added, DIM, device=device, dtype=torch.bfloat16)
        if decode:
            # The last `keys` positions, contiguous: what a paged kernel reads, without the paging.
            sets = max(1, math.ceil(ROTATION_BYTES / kv_bytes))
            kvs = [(torch.randn(batch, KV_HEADS, keys, DIM, device=device, dtype=torch.bfloat16),
                    torch.randn(batch, KV_HEADS, keys, DIM, device=device, dtype=torch.bfloat16)) for _ in range(sets)]
            turn = [0]

            def sdpa():
                k, v = kvs[turn[0] % sets]
                turn[0] += 1
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

            print(row(f"{name} (SDPA)", time_ms(sdpa, args.iterations, args.repeats), True, kv_bytes, flops), flush=True)
            del kvs
            continue
        k = torch.randn(batch, KV_HEADS, length, DIM, device=device, dtype=torch.bfloat16)
        v = torch.randn(batch, KV_HEADS, length, DIM, device=device, dtype=torch.bfloat16)
        if not window:
            ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                         args.iterations, args.repeats)
            print(row(f"{name} (SDPA)", ms, False, kv_bytes, flops), flush=True)
        if args.no_flex or args.flex_filter not in name:
            continue
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if window:
            def mask(b, h, q_idx, kv_idx):
                return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
        else:
            def mask(b, h, q_idx, kv_idx):
                return q_idx >= kv_idx
        block_mask = create_block_mask(mask, None, None, added, length, device=device)
        compiled = torch.compile(flex_attention)
        ms = time_ms(lambda: compiled(q, k, v, block_mask=block_mask, enable_gqa=True), args.iterations, args.repeats)
        print(row(f"{name} (flex_attention)", ms, False, kv_bytes, flops), flush=True)
    print(f"\nmedian of {args.iterations} samples of {args.repeats} back-to-back calls each; decode floors count K "
          "and V bytes read, prefill floors 4 x head_dim FLOPs per (query head, visible key) at 758 TFLOP/s")


if __name__ == "__main__":
    main()

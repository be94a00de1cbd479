#!/usr/bin/env python3
"""PyTorch doing the same work as `backend_ops perf linear`, on the same GPU, for the side-by-side table.

Per row count, Beam-1.0's dense weight reads of a decode step with torch.nn.functional.linear in BF16 (activations
rounded to BF16, F32 accumulation inside cuBLAS), laid out as vLLM lays them out: q|k|v as one fused weight, the
dense MLP as one gate|up weight then SiLU * up then down, the LM head with its tanh soft cap. Each case is replayed
as a CUDA graph; weights smaller than 256 MB are drawn in several copies that the graph cycles through, so that no
replay finds them in L2. Prints a Markdown table with `perf linear`'s floor (weight bytes / 4.8 TB/s).

Usage: python3 bench/torch_linear_peers.py [--rows 1,2,4,8,16,32] [--iterations 30]
"""
import argparse
import math
import statistics

import torch
import torch.nn.functional as F

HIDDEN, Q_WIDTH, KV_WIDTH, INTERMEDIATE, VOCAB, SOFTCAP = 5120, 48 * 128, 8 * 128, 20480, 201088, 30.0
HBM_BYTES_PER_SECOND = 4.8e12
MIN_BYTES_PER_REPLAY = 256e6


def weight(rows, cols):
    return (torch.rand(rows, cols, device="cuda", dtype=torch.bfloat16) * 2 - 1) / cols**0.5


def time_graph(op, copies, iterations):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in range(copies):
            op(c)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in range(copies):
            op(c)
    graph.replay()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(iterations + 1)]
    marks[0].record()
    for i in range(iterations):
        graph.replay()
        marks[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(marks[i].elapsed_time(marks[i + 1]) / copies for i in range(iterations))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(1)
    copies = lambda nbytes: max(1, math.ceil(MIN_BYTES_PER_REPLAY / nbytes))
    qkv_bytes = 2 * HIDDEN * (Q_WIDTH + 2 * KV_WIDTH)
    o_bytes = 2 * Q_WIDTH * HIDDEN
    mlp_bytes = 2 * 3 * HIDDEN * INTERMEDIATE
    head_bytes = 2 * VOCAB * HIDDEN
    qkv = [weight(Q_WIDTH + 2 * KV_WIDTH, HIDDEN) for _ in range(copies(qkv_bytes))]
    o = [weight(HIDDEN, Q_WIDTH) for _ in range(copies(o_bytes))]
    gate_up = [weight(2 * INTERMEDIATE, HIDDEN) for _ in range(copies(mlp_bytes))]
    down = [weight(HIDDEN, INTERMEDIATE) for _ in range(copies(mlp_bytes))]
    head = weight(VOCAB, HIDDEN)
    print(f"\nPyTorch {torch.__version__} on {torch.cuda.get_device_name()}: F.linear in BF16, CUDA graphs\n")
    print("| op | weights | rows | floor ms | PyTorch ms | PyTorch TB/s | floor / PyTorch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for rows in [int(r) for r in args.rows.split(",")]:
        h = torch.randn(rows, HIDDEN, device="cuda").to(torch.bfloat16)
        attended = torch.randn(rows, Q_WIDTH, device="cuda").to(torch.bfloat16)

        def mlp(c):
            gate, up = F.linear(h, gate_up[c]).chunk(2, dim=-1)
            return F.linear(F.silu(gate) * up, down[c])

        def lm_head(c):
            return SOFTCAP * torch.tanh(F.linear(h, head).float() / SOFTCAP)

        cases = [("q, k, v (one fused weight)", qkv_bytes, len(qkv), lambda c: F.linear(h, qkv[c])),
                 ("o", o_bytes, len(o), lambda c: F.linear(attended, o[c])),
                 ("dense SwiGLU MLP (gate, up fused)", mlp_bytes, len(gate_up), mlp),
                 ("LM head (soft cap)", head_bytes, 1, lm_head)]
        for name, nbytes, count, op in cases:
            ms = time_graph(op, count, args.iterations)
            floor_ms = nbytes / HBM_BYTES_PER_SECOND * 1e3
            print(f"| {name} | {nbytes / 1e6:.0f} MB | {rows} | {floor_ms:.4f} | {ms:.4f} | "
                  f"{nbytes / (ms * 1e-3) / 1e12:.2f} | {floor_ms / ms:.2f} |")


if __name__ == "__main__":
    main()

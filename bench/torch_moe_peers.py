#!/usr/bin/env python3
"""PyTorch doing the same work as `backend_ops perf moe`, on the same GPU, for the side-by-side table.

One Beam-1.0 MoE layer per token count: the FP32 router (sigmoid, group-limited top-k, renormalised, scaled),
then the experts with torch._grouped_mm (tokens sorted by expert, gate|up fused, SwiGLU, down, weighted sum back).
Weights are BF16 with F32 accumulation, like ours; the activations enter the GEMMs in BF16 (PyTorch's usual
path). Prints a Markdown table with the same floor as `perf moe` (router + touched experts read once / 4.8 TB/s).

Usage: python3 bench/torch_moe_peers.py [--tokens 1,16,64,256,1024] [--iterations 50]
"""
import argparse
import statistics

import torch

HIDDEN, EXPERTS, INTERMEDIATE, TOP_K, GROUPS, TOPK_GROUPS, SCALING = 5120, 256, 2560, 8, 8, 4, 2.5
HBM_BYTES_PER_SECOND = 4.8e12


def route(h, router, bias):
    scores = torch.sigmoid(h.float() @ router.t())
    choice = scores + bias
    grouped = choice.view(h.shape[0], GROUPS, EXPERTS // GROUPS)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(TOPK_GROUPS, dim=-1).indices, 1.0)
    masked = choice.masked_fill(keep.repeat_interleave(EXPERTS // GROUPS, dim=1) == 0, float("-inf"))
    ids = masked.topk(TOP_K, dim=-1).indices
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(-1, keepdim=True) * SCALING
    return ids, weights


def experts(h, ids, weights, gate_up, down):
    tokens = h.shape[0]
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=EXPERTS)
    offsets = counts.cumsum(0).to(torch.int32)
    rows = h.to(torch.bfloat16)[order // TOP_K]
    projected = torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=offsets)
    gate, up = projected.float().chunk(2, dim=-1)
    activated = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    expert_out = torch._grouped_mm(activated, down.transpose(-2, -1), offs=offsets).float()
    out = torch.zeros(tokens, HIDDEN, device=h.device, dtype=torch.float32)
    out.index_add_(0, order // TOP_K, expert_out * weights.flatten()[order, None])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="1,16,64,256,1024")
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(1)
    device = "cuda"
    router = torch.randn(EXPERTS, HIDDEN, device=device) * 0.05
    bias = torch.randn(EXPERTS, device=device) * 0.01
    gate_up = (torch.rand(EXPERTS, 2 * INTERMEDIATE, HIDDEN, device=device, dtype=torch.bfloat16) * 2 - 1) / HIDDEN**0.5
    down = (torch.rand(EXPERTS, HIDDEN, INTERMEDIATE, device=device, dtype=torch.bfloat16) * 2 - 1) / INTERMEDIATE**0.5
    print(f"\nPyTorch {torch.__version__} on {torch.cuda.get_device_name()}: router + torch._grouped_mm experts, eager\n")
    print("| tokens | experts hit | PyTorch MoE ms (route + experts) | floor ms | floor / time |")
    print("| --- | --- | --- | --- | --- |")
    for tokens in (int(t) for t in args.tokens.split(",")):
        h = torch.rand(tokens, HIDDEN, device=device) * 2 - 1
        layer = lambda: experts(h, *route(h, router, bias), gate_up, down)  # noqa: E731
        for _ in range(3):
            layer()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.iterations)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.iterations)]
        for start, end in zip(starts, ends):
            start.record()
            layer()
            end.record()
        torch.cuda.synchronize()
        ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
        hit = route(h, router, bias)[0].unique().numel()
        floor = (4 * EXPERTS * HIDDEN + 2 * 3 * HIDDEN * INTERMEDIATE * hit) / HBM_BYTES_PER_SECOND * 1e3
        print(f"| {tokens} | {hit} | {ms:.3f} | {floor:.3f} | {floor / ms:.2f} |")


if __name__ == "__main__":
    main()

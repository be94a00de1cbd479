#!/usr/bin/env python3
"""PyTorch doing the work of `backend_ops perf fp8` on the same GPU, for the side-by-side table.

Projections: torch._scaled_mm, FP8 e4m3 x e4m3 with rowwise scales (per token for the activations, per output row for
the weights; PyTorch's FP8 GEMM on Hopper, cuBLASLt), bf16 out, the activation quantization included, as a CUDA graph
over enough weight copies that L2 holds none between reads (rows padded to 16, cuBLASLt's FP8 minimum).
MoE: the FP32 router, then torch._scaled_grouped_mm experts (rowwise scales; tokens sorted by expert, gate|up fused,
SwiGLU, down, weighted sum back), in one CUDA graph where it can be captured, else eagerly (the table says which). Floors as in `backend_ops perf fp8`: max(bytes incl. scales / 4.8 TB/s,
FLOPs / 1,341 TFLOP/s).

With --blockwise the projections use block-128 scales instead (torch.nn.functional.scaled_mm, BlockWise1x128 activations x
BlockWise128x128 weights: cuBLASLt's block-scaled matmul, as beamline's FP8 path from 4 rows).

Usage: python3 bench/torch_fp8_peers.py [--rows 1,2,4,8,64,1024] [--tokens 1,16,64,256,1024,8192] [--blockwise]
"""
import argparse
import math
import statistics

import torch

HIDDEN, Q, KV, DENSE, VOCAB = 5120, 6144, 1024, 20480, 201088
EXPERTS, INTERMEDIATE, TOP_K, GROUPS, TOPK_GROUPS, SCALING = 256, 2560, 8, 8, 4, 2.5
HBM, FP8_PEAK = 4.8e12, 1341e12
E4M3_MAX = 448.0


def fp8_bytes(out, inp):
    return out * inp + 4 * math.ceil(out / 128) * math.ceil(inp / 128)


def quantize_rows(x):
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-10) / E4M3_MAX
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def fp8_weight(out, inp, device):
    w = torch.randn(out, inp, device=device) / inp**0.5
    q, s = quantize_rows(w)
    return q, s.reshape(1, out)


def quantize_groups(x):
    """Per row and 128 columns (DeepSeek-V3's activations): codes and F32 scales [rows, cols / 128], the scales
    outer-dim-major (rows contiguous) as cuBLASLt's VEC128_32F mode reads them."""
    rows, cols = x.shape
    groups = x.reshape(rows, cols // 128, 128)
    scale = groups.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-10) / E4M3_MAX
    codes = (groups / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(rows, cols)
    return codes, scale.reshape(rows, cols // 128).t().contiguous().t()


def fp8_block_weight(out, inp, device):
    """FP8 block-128 weight (the checkpoint's layout): codes [out, in] and one F32 scale per 128 x 128 block."""
    w = torch.randn(out, inp, device=device) / inp**0.5
    blocks = w.reshape(out // 128, 128, inp // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-10) / E4M3_MAX
    codes = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(out, inp)
    return codes, scale.reshape(out // 128, inp // 128).contiguous()


def graph_ms(body, iterations):
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for start, end in zip(starts, ends):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def eager_ms(body, iterations):
    for _ in range(3):
        body()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for start, end in zip(starts, ends):
        start.record()
        body()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def bench_linear(rows_list, iterations, device, blockwise):
    recipe = "block-128 FP8 (BlockWise1x128 x BlockWise128x128)" if blockwise else "rowwise FP8"
    print(f"\nPyTorch {torch.__version__} on {torch.cuda.get_device_name()}: scaled_mm, {recipe}, CUDA graph\n")
    print("| op | rows | floor ms | PyTorch ms | floor / time |")
    print("| --- | --- | --- | --- | --- |")
    ops = [("q|k|v (one GEMM)", Q + 2 * KV, HIDDEN), ("o", HIDDEN, Q), ("dense gate|up (one GEMM)", 2 * DENSE, HIDDEN),
           ("dense down", HIDDEN, DENSE), ("LM head", VOCAB, HIDDEN)]
    for name, out, inp in ops:
        nbytes = fp8_bytes(out, inp)
        copies = max(1, math.ceil(256e6 / nbytes))
        make = fp8_block_weight if blockwise else fp8_weight
        weights = [make(out, inp, device) for _ in range(copies)]
        for rows in rows_list:
            if name == "LM head" and rows > 64:
                continue
            padded = max(16, (rows + 15) // 16 * 16)
            x = torch.randn(padded, inp, device=device)

            def body():
                if blockwise:
                    xq, xs = quantize_groups(x)
                    for wq, ws in weights:
                        torch.nn.functional.scaled_mm(xq, wq.t(), xs, torch.nn.functional.ScalingType.BlockWise1x128,
                                                      ws.t(), torch.nn.functional.ScalingType.BlockWise128x128,
                                                      output_dtype=torch.bfloat16)
                    return
                xq, xs = quantize_rows(x)
                for wq, ws in weights:
                    torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)

            try:
                ms = graph_ms(body, iterations) / copies
            except Exception as error:  # noqa: BLE001 - report and go on
                print(f"| {name} | {rows} | — | error: {str(error).splitlines()[0][:80]} | — |")
                continue
            floor = max(nbytes / HBM, 2 * rows * out * inp / FP8_PEAK) * 1e3
            print(f"| {name} | {rows} | {floor:.4f} | {ms:.4f} | {floor / ms:.2f} |", flush=True)


def route(h, router, bias):
    scores = torch.sigmoid(h.float() @ router.t())
    choice = scores + bias
    grouped = choice.view(h.shape[0], GROUPS, EXPERTS // GROUPS)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(TOPK_GROUPS, dim=-1).indices, 1.0)
    masked = choice.masked_fill(keep.repeat_interleave(EXPERTS // GROUPS, dim=1) == 0, float("-inf"))
    ids = masked.topk(TOP_K, dim=-1).indices
    weights = scores.gather(1, ids)
    return ids, weights / weights.sum(-1, keepdim=True) * SCALING


def experts(h, ids, weights, gate_up, gate_up_scale, down, down_scale):
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    offsets = torch.bincount(flat, minlength=EXPERTS).cumsum(0).to(torch.int32)
    rows = h[order // TOP_K]
    rq, rs = quantize_rows(rows)
    projected = torch._scaled_grouped_mm(rq, gate_up.transpose(-2, -1), rs.reshape(-1), gate_up_scale, offs=offsets,
                                         out_dtype=torch.bfloat16)
    gate, up = projected.float().chunk(2, dim=-1)
    aq, as_ = quantize_rows(torch.nn.functional.silu(gate) * up)
    expert_out = torch._scaled_grouped_mm(aq, down.transpose(-2, -1), as_.reshape(-1), down_scale, offs=offsets,
                                          out_dtype=torch.bfloat16).float()
    out = torch.zeros(h.shape[0], HIDDEN, device=h.device, dtype=torch.float32)
    out.index_add_(0, order // TOP_K, expert_out * weights.flatten()[order, None])
    return out


def bench_moe(tokens_list, iterations, device):
    router = torch.randn(EXPERTS, HIDDEN, device=device) * 1e-3
    bias = torch.zeros(EXPERTS, device=device)
    gate_up = torch.empty(EXPERTS, 2 * INTERMEDIATE, HIDDEN, device=device, dtype=torch.float8_e4m3fn)
    down = torch.empty(EXPERTS, HIDDEN, INTERMEDIATE, device=device, dtype=torch.float8_e4m3fn)
    for e in range(EXPERTS):  # random codes, one expert at a time (the F32 stack would not fit)
        gate_up[e] = (torch.randn(2 * INTERMEDIATE, HIDDEN, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
        down[e] = (torch.randn(HIDDEN, INTERMEDIATE, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    gate_up_scale = torch.full((EXPERTS, 2 * INTERMEDIATE), 1 / (64 * HIDDEN**0.5), device=device)
    down_scale = torch.full((EXPERTS, HIDDEN), 1 / (64 * INTERMEDIATE**0.5), device=device)
    print("\nPyTorch FP8 MoE: router + torch._scaled_grouped_mm (rowwise scales), one CUDA graph\n")
    print("| tokens | experts hit | PyTorch ms | floor ms | floor / time |")
    print("| --- | --- | --- | --- | --- |")
    for tokens in tokens_list:
        h = torch.randn(tokens, HIDDEN, device=device)

        def body():
            experts(h, *route(h, router, bias), gate_up, gate_up_scale, down, down_scale)

        mode = "graph"
        try:
            ms = graph_ms(body, iterations)
        except Exception:  # noqa: BLE001 - a host sync in the routing or grouping: time it eagerly instead
            torch.cuda.synchronize()
            mode = "eager"
            ms = eager_ms(body, iterations)
        hit = route(h, router, bias)[0].unique().numel()
        nbytes = 4 * EXPERTS * HIDDEN + hit * 3 * fp8_bytes(HIDDEN, INTERMEDIATE)
        floor = max(nbytes / HBM, 6 * HIDDEN * INTERMEDIATE * tokens * TOP_K / FP8_PEAK) * 1e3
        print(f"| {tokens} | {hit} | {ms:.4f} ({mode}) | {floor:.4f} | {floor / ms:.2f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,64,1024")
    parser.add_argument("--tokens", default="1,16,64,256,1024,8192")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--no-linear", action="store_true")
    parser.add_argument("--no-moe", action="store_true")
    parser.add_argument("--blockwise", action="store_true",
                        help="projections with block-128 scales (activations per token and 128 channels, weights per "
                             "128 x 128 block), beamline's scheme, instead of rowwise")
    args = parser.parse_args()
    torch.manual_seed(1)
    if not args.no_linear:
        bench_linear([int(r) for r in args.rows.split(",")], args.iterations, "cuda", args.blockwise)
    if not args.no_moe:
        bench_moe([int(t) for t in args.tokens.split(",")], args.iterations, "cuda")


if __name__ == "__main__":
    main()

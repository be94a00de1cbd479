#pragma once
// The op families of backend_ops, one file each: its test cases (test mode: the device against the reference
// backend, each at the tolerance of its precision) and its timings (perf mode: `backend_ops perf FAMILY`, each
// figure next to its floor). main.cpp lists them; a new kernel is one more case in its family's file.
namespace CLI {
class App;
}

namespace beamline::backend_ops {

class Harness;

// rows.cpp: row-wise ops (no perf: they are timed inside the layer).
void test_place_tokens(Harness& harness);
void test_embedding(Harness& harness);
void test_norms(Harness& harness);
void test_rope_ssmax(Harness& harness);

// all_reduce_norm.cpp: the fused tensor-parallel all-reduce + residual add + RMSNorm (N ranks on one device).
void test_all_reduce_norm(Harness& harness);
void add_all_reduce_norm_perf(CLI::App& perf);

// linear.cpp: projections, q|k|v in one op, the dense SwiGLU MLP and the LM head.
void test_linear(Harness& harness);
void test_linear_rows(Harness& harness);
void test_linear_many(Harness& harness);
void test_swiglu(Harness& harness);
void test_lm_head(Harness& harness);
void add_linear_perf(CLI::App& perf);

// attention.cpp: write_kv and paged attention, the block drafter's block attention, and amax_scale (FP8 KV scales).
// kv_decode: attention's cases of E4M3 pools whose rows all take the split-KV decode kernel, so that each of its
// versions (BEAMLINE_CUDA_DECODE_ATTENTION) is checked in seconds.
void test_attention(Harness& harness);
void test_block_attention(Harness& harness);
void test_kv_decode(Harness& harness);
void test_amax_scale(Harness& harness);
void add_attention_perf(CLI::App& perf);

// moe.cpp: the router and the experts.
void test_route(Harness& harness);
void test_moe(Harness& harness);
void add_moe_perf(CLI::App& perf);

// sample.cpp: sampling with its filters and logprobs.
void test_sample(Harness& harness);
void add_sample_perf(CLI::App& perf);

// fp8.cpp: FP8 block-128 weights in every op that takes them.
void test_fp8(Harness& harness);
void add_fp8_perf(CLI::App& perf);

// micro_scaled.cpp: MXFP8 and NVFP4 weights in every op that takes them.
void test_mxfp8(Harness& harness);
void test_nvfp4(Harness& harness);
void add_micro_perf(CLI::App& perf);

// lora.cpp: gathered LoRA, rows of mixed adapters.
void test_lora(Harness& harness);
void add_lora_perf(CLI::App& perf);

// moe_lora.cpp: MoE LoRA, each token's adapter inside its routed experts at true rank.
void test_moe_lora(Harness& harness);
void add_moe_lora_perf(CLI::App& perf);

// batch_invariance.cpp: each op's rows alone and inside batches of other rows, bit for bit (--batch-invariant).
void test_batch_invariance(Harness& harness);

// layer.cpp: one full decoder layer, composed of the ops above (perf only).
void add_layer_perf(CLI::App& perf);

// roof.cpp (its kernel in roof_read.cu): this GPU's roofs, the best streaming read and cuBLAS's dense BF16 GEMM on the
// timed rows' byte counts and FLOPs (perf only: a measure, not an op).
void add_roof_perf(CLI::App& perf);

}  // namespace beamline::backend_ops

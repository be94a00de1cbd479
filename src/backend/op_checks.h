#pragma once
// Argument checks shared by every backend's ops, so each op's contract is enforced in one place and all
// backends reject a bad call with the same message. Backend-specific limits stay in the backends.
#include <cstdint>
#include <span>
#include <string_view>

#include "backend/backend.h"

namespace beamline {

// K/V pool layout and dtype, `slot` inside it, and the scales (F32 [2]) when defined.
void check_kv_pool(const PagedKvPool& pool, int32_t slot, std::string_view op);
// all_reduce_add_rms_norm's partials (1 to kMaxAllReduceRanks, each F32 of residual's [T, H] shape), residual F32
// [T, H], weight [H], next_weight [H] and out [T, H] both defined or both undefined. Returns H.
int64_t check_all_reduce_add_rms_norm_args(std::span<const Tensor> partials, const Tensor& residual,
                                           const Tensor& weight, const Tensor& next_weight, const Tensor& out);
// amax_scale's x and out F32, out one element, divisor positive and finite.
void check_amax_scale_args(const Tensor& x, float divisor, const Tensor& out);
// paged_attention's q/out shapes, heads against the pool, one block-table row per sequence.
void check_attention_args(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                          const AttentionBatch& batch, const AttentionParams& params, const Tensor& out);
// block_attention's: heads against the pool, one row per block at its last position (the host copies), q/out
// [B * S, heads * head_dim] with every block's B rows inside its sequence. Returns B.
int32_t check_block_attention_args(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                                   const AttentionBatch& blocks, const AttentionParams& params, const Tensor& out);
// route's router/bias dtypes and shapes, group parameters, output shapes and dtypes.
void check_route_args(const Tensor& h, const Tensor& router, const Tensor& bias, const RouterParams& params,
                      const Tensor& expert_ids, const Tensor& expert_weights);
// place_tokens' dtypes and shapes, and every (row, source row) pair inside `tokens` and `source`.
void check_place_tokens_args(const Tensor& source, std::span<const int32_t> pairs, const Tensor& tokens);
// sample's logits [R, V] F32, each row's settings (logit_row, ranges), output shapes and dtypes. Returns K,
// the most logprobs any row asks for (-1 when none asks).
int32_t check_sample_args(const Tensor& logits, std::span<const SampleRow> rows, const SampleOutputs& out);
// lora's a [N, R, in] and b [N, out, R] F32, x [T, in] and y [T, out] F32, indices I32 [T]. Returns N.
int64_t check_lora_args(const Tensor& x, const LoraTensors& lora, const Tensor& indices, const Tensor& y);
// Backend::moe_lora's SwigluLora against the experts: each defined table I64 [slots x experts, 3] with in / out those
// of its projection (gate, up: H -> I; down: I -> H) and max_rank >= 1; row_adapters I32 [T]. Returns the experts.
int64_t check_moe_lora_args(const Tensor& h, const MoeTensors& moe, const SwigluLora& lora);
// mask_logits' logits [R, V] F32, allowed I32 [N, W >= ceil(V / 32)], one row in [0, R) per mask.
void check_mask_logits_args(const Tensor& logits, std::span<const int32_t> rows, const Tensor& allowed);

}  // namespace beamline

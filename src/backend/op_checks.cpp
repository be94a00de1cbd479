#include "backend/op_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "util/error.h"

namespace beamline {

void check_kv_pool(const PagedKvPool& pool, int32_t slot, std::string_view op) {
  require(pool.k.rank() == 5, "{}: KV pool must be [blocks, slots, block_size, kv_heads, head_dim], got {}", op,
          describe(pool.k));
  require_shape(pool.v, pool.k.shape(), op, "v pool");
  const DType dtype = pool.k.dtype();
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F8_E4M3,
          "{}: KV pool dtype {} (expected F32, BF16 or F8_E4M3)", op, dtype_name(dtype));
  require_dtype(pool.v, pool.k.dtype(), op, "v pool");
  require(slot >= 0 && slot < pool.slots_per_block(), "{}: slot {} outside the {} slots per block", op, slot,
          pool.slots_per_block());
  if (pool.scales.defined()) {
    require_dtype(pool.scales, DType::F32, op, "KV scales");
    require_shape(pool.scales, {2}, op, "KV scales (k_scale, v_scale)");
  }
}

void check_amax_scale_args(const Tensor& x, float divisor, const Tensor& out) {
  require_dtype(x, DType::F32, "amax_scale", "x");
  require_dtype(out, DType::F32, "amax_scale", "out");
  require(out.numel() == 1, "amax_scale: out {} must hold one element", describe(out));
  require(divisor > 0.0f && std::isfinite(divisor), "amax_scale: divisor {} must be positive and finite", divisor);
}

int64_t check_all_reduce_add_rms_norm_args(std::span<const Tensor> partials, const Tensor& residual,
                                           const Tensor& weight, const Tensor& next_weight, const Tensor& out) {
  constexpr std::string_view op = "all_reduce_add_rms_norm";
  require(!partials.empty() && partials.size() <= static_cast<std::size_t>(kMaxAllReduceRanks),
          "{}: {} partials, expected 1 to {} (one per rank)", op, partials.size(), kMaxAllReduceRanks);
  require(residual.rank() == 2, "{}: residual must be [T, H], got {}", op, describe(residual));
  require_dtype(residual, DType::F32, op, "residual");
  for (std::size_t r = 0; r < partials.size(); ++r) {
    const std::string what = fmt::format("partial of rank {}", r);
    require_shape(partials[r], residual.shape(), op, what);
    require_dtype(partials[r], DType::F32, op, what);
  }
  const int64_t hidden = residual.dim(1);
  require_shape(weight, {hidden}, op, "weight");
  require(next_weight.defined() == out.defined(), "{}: next_weight and out must be both given or both left out", op);
  if (out.defined()) {
    require_shape(next_weight, {hidden}, op, "next_weight");
    require_dtype(next_weight, weight.dtype(), op, "next_weight (the dtype of weight)");
    require_shape(out, residual.shape(), op, "out");
    require_dtype(out, DType::F32, op, "out");
  }
  return hidden;
}

void check_attention_args(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                          const AttentionBatch& batch, const AttentionParams& params, const Tensor& out) {
  check_kv_pool(pool, params.slot, "paged_attention");
  const int32_t heads = params.num_heads, kv_heads = params.num_kv_heads, dim = params.head_dim;
  require(kv_heads == pool.num_kv_heads() && dim == pool.head_dim(),
          "paged_attention: params ({} kv heads x {}) do not match the pool ({} x {})", kv_heads, dim,
          pool.num_kv_heads(), pool.head_dim());
  require(kv_heads > 0 && heads % kv_heads == 0, "paged_attention: {} query heads for {} kv heads", heads, kv_heads);
  require_shape(q, {int64_t{batch.num_rows()}, int64_t{heads} * dim}, "paged_attention", "q");
  require_shape(out, q.shape(), "paged_attention", "out");
  require(block_table.rank() == 2 && block_table.dim(0) == batch.num_sequences(),
          "paged_attention: block table {} does not have one row per sequence ({})", describe(block_table),
          batch.num_sequences());
}

int32_t check_block_attention_args(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                                   const AttentionBatch& blocks, const AttentionParams& params, const Tensor& out) {
  constexpr std::string_view op = "block_attention";
  check_kv_pool(pool, params.slot, op);
  const int32_t heads = params.num_heads, kv_heads = params.num_kv_heads, dim = params.head_dim;
  require(kv_heads == pool.num_kv_heads() && dim == pool.head_dim(),
          "{}: params ({} kv heads x {}) do not match the pool ({} x {})", op, kv_heads, dim, pool.num_kv_heads(),
          pool.head_dim());
  require(kv_heads > 0 && heads % kv_heads == 0, "{}: {} query heads for {} kv heads", op, heads, kv_heads);
  const int32_t sequences = blocks.num_sequences();
  require(sequences > 0 && blocks.num_rows() == sequences,
          "{}: {} rows for {} blocks (one row per block, at its last position)", op, blocks.num_rows(), sequences);
  require(q.rank() == 2 && q.dim(0) % sequences == 0 && q.dim(0) > 0,
          "{}: q {} does not hold a whole block of rows for each of the {} blocks", op, describe(q), sequences);
  const auto block = static_cast<int32_t>(q.dim(0) / sequences);
  require_shape(q, {int64_t{block} * sequences, int64_t{heads} * dim}, op, "q");
  require_shape(out, q.shape(), op, "out");
  require(block_table.rank() == 2 && block_table.dim(0) == sequences,
          "{}: block table {} does not have one row per block ({})", op, describe(block_table), sequences);
  for (int32_t s = 0; s < sequences; ++s) {
    require(blocks.host_query_start[s] == s && blocks.host_row_sequence[s] == s &&
                blocks.host_positions[s] == blocks.host_seq_lens[s] - 1,
            "{}: block {} is not one row at its last position (row {} of sequence {} at position {}, {} keys)", op, s,
            blocks.host_query_start[s], blocks.host_row_sequence[s], blocks.host_positions[s], blocks.host_seq_lens[s]);
    require(blocks.host_seq_lens[s] >= block, "{}: block {} has {} keys, fewer than its {} rows", op, s,
            blocks.host_seq_lens[s], block);
  }
  return block;
}

void check_route_args(const Tensor& h, const Tensor& router, const Tensor& bias, const RouterParams& params,
                      const Tensor& expert_ids, const Tensor& expert_weights) {
  const int64_t rows = h.dim(0), hidden = h.dim(1), experts = router.dim(0);
  require_dtype(router, DType::F32, "route", "router");
  require_dtype(bias, DType::F32, "route", "bias");
  require_shape(router, {experts, hidden}, "route", "router");
  require_shape(bias, {experts}, "route", "bias");
  require(params.n_group > 0 && experts % params.n_group == 0, "route: {} experts do not split into {} groups", experts,
          params.n_group);
  const int64_t group_size = experts / params.n_group;
  require(params.topk_group > 0 && params.topk_group <= params.n_group, "route: topk_group {} of {} groups",
          params.topk_group, params.n_group);
  require(params.top_k > 0 && params.top_k <= params.topk_group * group_size,
          "route: top_k {} exceeds the {} experts of the kept groups", params.top_k, params.topk_group * group_size);
  require_shape(expert_ids, {rows, params.top_k}, "route", "expert_ids");
  require_shape(expert_weights, {rows, params.top_k}, "route", "expert_weights");
  require_dtype(expert_ids, DType::I32, "route", "expert_ids");
  require_dtype(expert_weights, DType::F32, "route", "expert_weights");
}

void check_place_tokens_args(const Tensor& source, std::span<const int32_t> pairs, const Tensor& tokens) {
  require(source.rank() == 1 && tokens.rank() == 1, "place_tokens: source {} and tokens {} must be vectors",
          describe(source), describe(tokens));
  require_dtype(source, DType::I32, "place_tokens", "source");
  require_dtype(tokens, DType::I32, "place_tokens", "tokens");
  require(pairs.size() % 2 == 0, "place_tokens: {} values do not make (row, source row) pairs", pairs.size());
  for (std::size_t j = 0; j < pairs.size(); j += 2) {
    require(pairs[j] >= 0 && pairs[j] < tokens.dim(0), "place_tokens: pair {} writes token row {} of {}", j / 2,
            pairs[j], tokens.dim(0));
    require(pairs[j + 1] >= 0 && pairs[j + 1] < source.dim(0), "place_tokens: pair {} reads source row {} of {}",
            j / 2, pairs[j + 1], source.dim(0));
  }
}

void check_mask_logits_args(const Tensor& logits, std::span<const int32_t> rows, const Tensor& allowed) {
  require(logits.rank() == 2, "mask_logits: logits must be [R, V], got {}", describe(logits));
  require_dtype(logits, DType::F32, "mask_logits", "logits");
  require_dtype(allowed, DType::I32, "mask_logits", "allowed");
  const int64_t words = (logits.dim(1) + 31) / 32;
  require(allowed.rank() == 2 && allowed.dim(0) == static_cast<int64_t>(rows.size()) && allowed.dim(1) >= words,
          "mask_logits: allowed {} must be [{}, >= {}] for {} rows of {} tokens", describe(allowed), rows.size(), words,
          rows.size(), logits.dim(1));
  for (std::size_t i = 0; i < rows.size(); ++i)
    require(rows[i] >= 0 && rows[i] < logits.dim(0), "mask_logits: mask {} names logit row {} of {}", i, rows[i],
            logits.dim(0));
}

int32_t check_sample_args(const Tensor& logits, std::span<const SampleRow> rows, const SampleOutputs& out) {
  require(logits.rank() == 2, "sample: logits must be [R, V], got {}", describe(logits));
  require_dtype(logits, DType::F32, "sample", "logits");
  const int64_t count = static_cast<int64_t>(rows.size()), vocab = logits.dim(1);
  require(vocab > 0, "sample: logits {} have no tokens", describe(logits));
  int32_t max_logprobs = -1;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& row = rows[i];
    require(row.logit_row >= 0 && row.logit_row < logits.dim(0), "sample: row {} reads logit row {} of {}", i,
            row.logit_row, logits.dim(0));
    require(row.num_logprobs >= -1 && row.num_logprobs <= vocab, "sample: row {} asks for {} logprobs of {} tokens",
            i, row.num_logprobs, vocab);
    if (!row.greedy) {
      require(row.temperature > 0.0f && std::isfinite(row.temperature), "sample: row {} has temperature {}", i,
              row.temperature);
      require(row.min_p >= 0.0f && row.min_p <= 1.0f, "sample: row {} has min_p {} outside [0, 1]", i, row.min_p);
      require(row.top_p > 0.0f && row.top_p <= 1.0f, "sample: row {} has top_p {} outside (0, 1]", i, row.top_p);
      require(row.uniform >= 0.0 && row.uniform < 1.0, "sample: row {} has uniform {} outside [0, 1)", i, row.uniform);
    }
    max_logprobs = std::max(max_logprobs, row.num_logprobs);
  }
  require_shape(out.tokens, {count}, "sample", "tokens");
  require_dtype(out.tokens, DType::I32, "sample", "tokens");
  if (max_logprobs >= 0) {
    require_shape(out.logprobs, {count}, "sample", "logprobs");
    require_dtype(out.logprobs, DType::F32, "sample", "logprobs");
    require_shape(out.ranks, {count}, "sample", "ranks");
    require_dtype(out.ranks, DType::I32, "sample", "ranks");
    require(out.top_ids.rank() == 2 && out.top_ids.dim(0) == count && out.top_ids.dim(1) >= max_logprobs,
            "sample: top_ids {} must be [{}, K] with K >= {}", describe(out.top_ids), count, max_logprobs);
    require_dtype(out.top_ids, DType::I32, "sample", "top_ids");
    require_shape(out.top_logprobs, out.top_ids.shape(), "sample", "top_logprobs");
    require_dtype(out.top_logprobs, DType::F32, "sample", "top_logprobs");
  }
  return max_logprobs;
}

int64_t check_lora_args(const Tensor& x, const LoraTensors& lora, const Tensor& indices, const Tensor& y) {
  require(lora.a.rank() == 3 && lora.b.rank() == 3, "lora: a {} and b {} must be [N, R, in] and [N, out, R]",
          describe(lora.a), describe(lora.b));
  const int64_t adapters = lora.a.dim(0), rank = lora.a.dim(1), in = lora.a.dim(2), out = lora.b.dim(1);
  require_dtype(lora.a, DType::F32, "lora", "a");
  require_dtype(lora.b, DType::F32, "lora", "b");
  require_shape(lora.b, {adapters, out, rank}, "lora", "b");
  require(x.rank() == 2, "lora: x {} must be [T, {}]", describe(x), in);
  require_dtype(x, DType::F32, "lora", "x");
  require_dtype(y, DType::F32, "lora", "y");
  require_dtype(indices, DType::I32, "lora", "indices");
  require_shape(x, {x.dim(0), in}, "lora", "x");
  require_shape(y, {x.dim(0), out}, "lora", "y");
  require_shape(indices, {x.dim(0)}, "lora", "indices");
  return adapters;
}

namespace {
void check_lora_table(const LoraTable& table, int64_t experts, int64_t in, int64_t out, std::string_view what) {
  if (!table.defined()) return;
  require(table.entries.rank() == 2 && table.entries.dim(1) == 3 && table.entries.dim(0) % experts == 0,
          "moe_lora: {} table {} is not [slots x {} experts, 3]", what, describe(table.entries), experts);
  require_dtype(table.entries, DType::I64, "moe_lora", what);
  require(table.in == in && table.out == out && table.max_rank >= 1,
          "moe_lora: {} table is {} -> {} of rank up to {}, the experts' projection is {} -> {}", what, table.in,
          table.out, table.max_rank, in, out);
}
}  // namespace

int64_t check_moe_lora_args(const Tensor& h, const MoeTensors& moe, const SwigluLora& lora) {
  const auto experts = static_cast<int64_t>(moe.experts.size());
  require(experts > 0, "moe_lora: no experts");
  const int64_t hidden = h.dim(1), intermediate = moe.experts.front().gate.out_features();
  check_lora_table(lora.gate, experts, hidden, intermediate, "gate");
  check_lora_table(lora.up, experts, hidden, intermediate, "up");
  check_lora_table(lora.down, experts, intermediate, hidden, "down");
  require_shape(lora.row_adapters, {h.dim(0)}, "moe_lora", "row_adapters");
  require_dtype(lora.row_adapters, DType::I32, "moe_lora", "row_adapters");
  return experts;
}

}  // namespace beamline

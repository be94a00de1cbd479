#include "backend/op_checks.h"

#include "util/error.h"

namespace beamline {

void check_kv_pool(const PagedKvPool& pool, int32_t slot, std::string_view op) {
  require(pool.k.rank() == 5, "{}: KV pool must be [blocks, slots, block_size, kv_heads, head_dim], got {}", op,
          describe(pool.k));
  require_shape(pool.v, pool.k.shape(), op, "v pool");
  require(pool.k.dtype() == DType::F32 || pool.k.dtype() == DType::BF16, "{}: KV pool dtype {} (expected F32 or BF16)",
          op, dtype_name(pool.k.dtype()));
  require_dtype(pool.v, pool.k.dtype(), op, "v pool");
  require(slot >= 0 && slot < pool.slots_per_block(), "{}: slot {} outside the {} slots per block", op, slot,
          pool.slots_per_block());
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

}  // namespace beamline

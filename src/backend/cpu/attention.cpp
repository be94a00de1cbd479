// Paged KV writes, paged attention and the KV scales' amax on the CPU.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "backend/op_checks.h"
#include "util/error.h"
#include "util/thread_pool.h"
#include "kv/kv_cache_layout.h"

namespace beamline {
namespace {

int64_t pool_offset(const PagedKvPool& pool, int32_t block, int32_t slot, int32_t in_block, int32_t kv_head) {
  return kv_pool_offset(block, slot, in_block, kv_head, pool.slots_per_block(), pool.block_size(), pool.num_kv_heads(),
                        pool.head_dim());
}

int32_t block_of(const Tensor& block_table, int32_t sequence, int64_t position, int32_t block_size,
                 std::string_view op) {
  const int64_t index = position / block_size, width = block_table.dim(1);
  require(index < width, "{}: position {} of sequence {} is past its block table ({} blocks of {})", op, position,
          sequence, width, block_size);
  return block_table.data<const int32_t>()[int64_t{sequence} * width + index];
}

// The (k_scale, v_scale) an E4M3 pool's codes are multiplied by (backend.h's PagedKvPool::scales); 1.0 otherwise.
std::array<float, 2> kv_scales(const PagedKvPool& pool) {
  if (pool.k.dtype() != DType::F8_E4M3 || !pool.scales.defined()) return {1.0f, 1.0f};
  const float* scales = pool.scales.data<const float>();
  return {scales[0], scales[1]};
}

// n values divided by `scale` then stored as `dtype` at element `offset` of `raw` (the values as they are for 1.0).
void store_scaled(const float* values, int64_t n, float scale, DType dtype, int64_t offset, std::byte* raw) {
  if (scale == 1.0f) return cpu::from_f32(values, n, dtype, offset, raw);
  thread_local std::vector<float> scaled;
  scaled.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) scaled[static_cast<std::size_t>(i)] = values[i] / scale;
  cpu::from_f32(scaled.data(), n, dtype, offset, raw);
}

}  // namespace

void CpuBackend::amax_scale(const Tensor& x, float divisor, Tensor& out) {
  check_amax_scale_args(x, divisor, out);
  const float* values = x.data<const float>();
  float amax = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) amax = std::fmax(amax, std::fabs(values[i]));  // fmax skips NaN
  out.data<float>()[0] = amax > 0.0f && std::isfinite(amax) ? amax / divisor : 1.0f;
}

void CpuBackend::write_kv(const Tensor& k, const Tensor& v, PagedKvPool& pool, int32_t slot, const Tensor& block_table,
                          const AttentionBatch& batch) {
  check_kv_pool(pool, slot, "write_kv");
  const int64_t rows = batch.num_rows(), width = int64_t{pool.num_kv_heads()} * pool.head_dim();
  require_shape(k, {rows, width}, "write_kv", "k");
  require_shape(v, {rows, width}, "write_kv", "v");
  require(block_table.rank() == 2 && block_table.dim(0) == batch.num_sequences(),
          "write_kv: block table {} does not have one row per sequence ({})", describe(block_table),
          batch.num_sequences());
  const std::array<float, 2> scales = kv_scales(pool);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t position = batch.host_positions[r], sequence = batch.host_row_sequence[r];
    const int32_t block = block_of(block_table, sequence, position, pool.block_size(), "write_kv");
    require(block >= 0 && block < pool.num_blocks(), "write_kv: row {} (position {}) maps to block {} of a pool of {}",
            r, position, block, pool.num_blocks());
    const int64_t offset = pool_offset(pool, block, slot, position % pool.block_size(), 0);
    store_scaled(k.data<const float>() + r * width, width, scales[0], pool.k.dtype(), offset, pool.k.raw());
    store_scaled(v.data<const float>() + r * width, width, scales[1], pool.v.dtype(), offset, pool.v.raw());
  }
}

namespace {

// Where row r of an attention op reads: its sequence and the key positions [first, last] it sees.
struct RowKeys {
  int32_t sequence;
  int64_t position, first, last;
};

// out[r, h] = softmax over row r's keys (RowKeys) of scale * q[r, h] · K, times V: paged_attention's math, shared
// by every attention op so that they agree bit for bit where their key ranges do.
template <typename KeysOf>
void attend(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table, const AttentionParams& params,
            int64_t rows, std::string_view op, KeysOf keys_of, Tensor& out) {
  const int32_t heads = params.num_heads, kv_heads = params.num_kv_heads, dim = params.head_dim;
  const int32_t group = heads / kv_heads, block_size = pool.block_size();
  const bool convert = pool.k.dtype() != DType::F32;
  const auto [k_scale, v_scale] = kv_scales(pool);

  ThreadPool::global().parallel_for(static_cast<std::size_t>(rows * heads), [&](std::size_t begin, std::size_t end) {
    thread_local std::vector<float> scores, accumulator, key, value;
    accumulator.resize(static_cast<std::size_t>(dim));
    key.resize(static_cast<std::size_t>(dim));
    value.resize(static_cast<std::size_t>(dim));
    for (std::size_t item = begin; item < end; ++item) {
      const auto r = static_cast<int64_t>(item / static_cast<std::size_t>(heads));
      const auto h = static_cast<int32_t>(item % static_cast<std::size_t>(heads));
      const int32_t kv_head = h / group;
      const RowKeys row = keys_of(r);
      const int32_t sequence = row.sequence;
      const int64_t first = row.first, last = row.last;
      const float* query = q.data<const float>() + (r * heads + h) * dim;
      float* result = out.data<float>() + (r * heads + h) * dim;
      const auto count = static_cast<std::size_t>(std::max<int64_t>(0, last - first + 1));
      scores.resize(count);
      auto locate = [&](int64_t t) {
        const int32_t block = block_of(block_table, sequence, t, block_size, op);
        require(block >= 0 && block < pool.num_blocks(),
                "{}: position {} of sequence {} is visible to position {} but its block is {}", op, t, sequence,
                row.position, block);
        return pool_offset(pool, block, params.slot, static_cast<int32_t>(t % block_size), kv_head);
      };
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t t = first; t <= last; ++t) {
        const int64_t offset = locate(t);
        const float* k = pool.k.data<const float>() + offset;
        if (convert) {
          cpu::to_f32(pool.k.raw(), pool.k.dtype(), offset, dim, key.data());
          if (k_scale != 1.0f)
            for (float& element : key) element *= k_scale;
          k = key.data();
        }
        const float score = params.scale * cpu::dot(query, k, dim);
        scores[static_cast<std::size_t>(t - first)] = score;
        max_score = std::max(max_score, score);
      }
      std::fill(accumulator.begin(), accumulator.end(), 0.0f);
      float total = 0.0f;
      for (int64_t t = first; t <= last; ++t) {
        const float weight = std::exp(scores[static_cast<std::size_t>(t - first)] - max_score);
        total += weight;
        const int64_t offset = locate(t);
        const float* v = pool.v.data<const float>() + offset;
        if (convert) {
          cpu::to_f32(pool.v.raw(), pool.v.dtype(), offset, dim, value.data());
          if (v_scale != 1.0f)
            for (float& element : value) element *= v_scale;
          v = value.data();
        }
        for (int32_t d = 0; d < dim; ++d) accumulator[d] += weight * v[d];
      }
      const float inverse = count > 0 ? 1.0f / total : 0.0f;
      for (int32_t d = 0; d < dim; ++d) result[d] = accumulator[d] * inverse;
    }
  });
}

}  // namespace

void CpuBackend::paged_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                                 const AttentionBatch& batch, const AttentionParams& params, Tensor& out) {
  check_attention_args(q, pool, block_table, batch, params, out);
  attend(q, pool, block_table, params, batch.num_rows(), "paged_attention", [&](int64_t r) {
    const int32_t sequence = batch.host_row_sequence[r];
    const int64_t position = batch.host_positions[r];
    return RowKeys{sequence, position, first_visible_position(position, params.sliding_window),
                   std::min<int64_t>(position, int64_t{batch.host_seq_lens[sequence]} - 1)};
  }, out);
}

void CpuBackend::block_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                                 const AttentionBatch& blocks, const AttentionParams& params, Tensor& out) {
  const int32_t block = check_block_attention_args(q, pool, block_table, blocks, params, out);
  const int64_t sequences = blocks.num_sequences();
  attend(q, pool, block_table, params, q.dim(0), "block_attention", [&](int64_t r) {
    const auto sequence = static_cast<int32_t>(r % sequences);
    const int64_t end = blocks.host_seq_lens[sequence], position = end - block + r / sequences;
    return RowKeys{sequence, position, first_visible_position(position, params.sliding_window), end - 1};
  }, out);
}

}  // namespace beamline

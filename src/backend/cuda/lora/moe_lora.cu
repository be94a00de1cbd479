// The experts' LoRA as deltas for moe's expert kernels: per slot (token, j), the shrink x · Aᵀ to the entry's rank
// and the expand through B, segmented by the slot's (expert, adapter) entry of each projection's table; the base
// expert GEMMs, SwiGLU and combine are moe's (moe/moe.h, ExpertDeltas).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/lora/moe_lora.h"

namespace beamline::cuda {
namespace {

constexpr int kShrinkThreads = 256;
constexpr int kExpandThreads = 256;
constexpr int32_t kGroupTileSlots = 8;  // moe_group_slots' tile (only its grouping by expert is used here)

// The slot worked at position p: the p-th grouped by expert, or p itself; -1 past the grouped ones.
__device__ __forceinline__ int32_t slot_at(const int32_t* grouped, int64_t p) {
  return grouped != nullptr ? grouped[p] : static_cast<int32_t>(p);
}

// The table entry {a, b, rank} of slot s (its token's adapter, its expert), or null: no table, no adapter, rank 0,
// or an expert id out of range.
__device__ __forceinline__ const int64_t* lora_entry(const LoraTableView& table, const int32_t* ids,
                                                     const int32_t* row_adapters, int32_t experts, int32_t top_k,
                                                     int32_t s) {
  if (table.entries == nullptr) return nullptr;
  const int32_t e = ids[s];
  if (e < 0 || e >= experts) return nullptr;
  const int32_t adapter = row_adapters[s / top_k];
  if (adapter < 0) return nullptr;
  const int64_t* entry = table.entries + (int64_t{adapter} * experts + e) * 3;
  return entry[2] > 0 ? entry : nullptr;
}

__device__ __forceinline__ bool aligned16(const void* address) {
  return reinterpret_cast<uintptr_t>(address) % 16 == 0;
}

// The shrink's input row x_s of slot s, `width` wide: rows as moe hands the SwiGLU output to the down delta (F32, or
// the tensor-core kernels' BF16 row sets; moe/moe.h), or h as F32 rows; row rows.slot_row[s], or s / divisor
// without slot_row.
struct ShrinkInput {
  SwigluRows rows;
  int32_t divisor = 1;
  int64_t width = 0;
};

// x at offset .. offset + 3 (offset a multiple of 4, the rows 16-byte aligned for F32).
template <bool kBf16>
__device__ __forceinline__ float4 load4(const ShrinkInput& x, int64_t offset) {
  if constexpr (kBf16) {
    auto term = [&](int32_t t) {
      const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(x.rows.terms + t * x.rows.term_stride + offset);
      const float2 a = __bfloat1622float2(pairs[0]), b = __bfloat1622float2(pairs[1]);
      return float4{a.x, a.y, b.x, b.y};
    };
    float4 value = term(0);
    for (int32_t t = 1; t < x.rows.term_count; ++t) {
      const float4 next = term(t);
      value = {value.x + next.x, value.y + next.y, value.z + next.z, value.w + next.w};
    }
    return value;
  } else {
    return *reinterpret_cast<const float4*>(x.rows.f32 + offset);
  }
}

template <bool kBf16>
__device__ __forceinline__ float load1(const ShrinkInput& x, int64_t offset) {
  if constexpr (kBf16) {
    float value = __bfloat162float(x.rows.terms[offset]);
    for (int32_t t = 1; t < x.rows.term_count; ++t)
      value += __bfloat162float(x.rows.terms[t * x.rows.term_stride + offset]);
    return value;
  } else {
    return x.rows.f32[offset];
  }
}

// shrunk_q[s, r] = a_q[r] · x_s for rank row r = blockIdx.y of the slot at position blockIdx.x and each projection q
// (first, second: one or two tables sharing the input) whose entry has a rank above r. A block per (slot, rank row),
// all its threads along k: even one token's few slots keep enough loads in flight.
template <bool kBf16>
__global__ void __launch_bounds__(kShrinkThreads)
    shrink_kernel(ShrinkInput x, const int32_t* grouped, const int32_t* ids, const int32_t* row_adapters,
                  int32_t experts, int32_t top_k, LoraTableView first, float* first_shrunk, LoraTableView second,
                  float* second_shrunk) {
  const int32_t s = slot_at(grouped, blockIdx.x);
  if (s < 0) return;
  const int64_t r = blockIdx.y;
  const int64_t* entry[2] = {lora_entry(first, ids, row_adapters, experts, top_k, s),
                             lora_entry(second, ids, row_adapters, experts, top_k, s)};
  const bool used[2] = {entry[0] != nullptr && r < entry[0][2], entry[1] != nullptr && r < entry[1][2]};
  if (!used[0] && !used[1]) return;  // the same for the whole block
  const int64_t in = x.width;
  const int64_t base = (x.rows.slot_row != nullptr ? int64_t{x.rows.slot_row[s]} : int64_t{s / x.divisor}) * in;
  const float* a[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) a[q] = used[q] ? reinterpret_cast<const float*>(entry[q][0]) + r * in : nullptr;
  float sum[2] = {0.0f, 0.0f};
  if (in % 4 == 0 && aligned16(a[0]) && aligned16(a[1]) && (kBf16 || aligned16(x.rows.f32))) {
#pragma unroll 4
    for (int64_t k = int64_t{threadIdx.x} * 4; k < in; k += kShrinkThreads * 4) {
      const float4 v = load4<kBf16>(x, base + k);
#pragma unroll
      for (int q = 0; q < 2; ++q)
        if (used[q]) {
          const float4 w = *reinterpret_cast<const float4*>(a[q] + k);
          sum[q] += w.x * v.x + w.y * v.y + w.z * v.z + w.w * v.w;
        }
    }
  } else {
    for (int64_t k = threadIdx.x; k < in; k += kShrinkThreads) {
      const float v = load1<kBf16>(x, base + k);
#pragma unroll
      for (int q = 0; q < 2; ++q)
        if (used[q]) sum[q] += a[q][k] * v;
    }
  }
  const float total[2] = {block_sum(sum[0]), block_sum(sum[1])};
  if (threadIdx.x != 0) return;
  if (used[0]) first_shrunk[int64_t{s} * first.max_rank + r] = total[0];
  if (used[1]) second_shrunk[int64_t{s} * second.max_rank + r] = total[1];
}

// delta[s, i] for i = q * out + o < projections * out (a thread per i along blockIdx.y): b_q[o] · shrunk_q[s] over
// the rank of the slot's entry of projection q (first, second), 0 without one. The slot is the one at position
// blockIdx.x.
__global__ void __launch_bounds__(kExpandThreads)
    expand_kernel(const int32_t* grouped, const int32_t* ids, const int32_t* row_adapters, int32_t experts,
                  int32_t top_k, int64_t out, int32_t projections, LoraTableView first, const float* first_shrunk,
                  LoraTableView second, const float* second_shrunk, float* delta) {
  const int32_t s = slot_at(grouped, blockIdx.x);
  if (s < 0) return;
  const int64_t i = int64_t{blockIdx.y} * kExpandThreads + threadIdx.x;
  if (i >= projections * out) return;
  const bool is_second = i >= out;
  const LoraTableView& table = is_second ? second : first;
  const int64_t* entry = lora_entry(table, ids, row_adapters, experts, top_k, s);
  float sum = 0.0f;
  if (entry != nullptr) {
    const int64_t rank = entry[2], o = is_second ? i - out : i;
    const float* b = reinterpret_cast<const float*>(entry[1]) + o * rank;
    const float* shrunk = (is_second ? second_shrunk : first_shrunk) + int64_t{s} * table.max_rank;
    if (rank % 4 == 0 && aligned16(b)) {
      for (int64_t r = 0; r < rank; r += 4) {
        const float4 w = *reinterpret_cast<const float4*>(b + r);
        sum += w.x * shrunk[r] + w.y * shrunk[r + 1] + w.z * shrunk[r + 2] + w.w * shrunk[r + 3];
      }
    } else {
      for (int64_t r = 0; r < rank; ++r) sum += b[r] * shrunk[r];
    }
  }
  delta[int64_t{s} * projections * out + i] = sum;
}

// The shrink of one or two tables over `x`, then their expand into `delta` [A, projections * out].
cudaError_t shrink_expand(const MoeLoraArgs& args, const int32_t* grouped, const ShrinkInput& x, bool bf16,
                          LoraTableView first, float* first_shrunk, LoraTableView second, float* second_shrunk,
                          int32_t projections, int64_t out, float* delta, cudaStream_t stream) {
  const auto positions = static_cast<unsigned int>(args.rows * args.top_k);
  const int64_t rank_rows = std::max(first.entries != nullptr ? first.max_rank : 0,
                                     second.entries != nullptr ? second.max_rank : 0);
  if (rank_rows > 0) {
    const dim3 grid(positions, static_cast<unsigned int>(rank_rows));
    if (bf16)
      shrink_kernel<true><<<grid, kShrinkThreads, 0, stream>>>(x, grouped, args.ids, args.row_adapters, args.experts,
                                                               args.top_k, first, first_shrunk, second, second_shrunk);
    else
      shrink_kernel<false><<<grid, kShrinkThreads, 0, stream>>>(x, grouped, args.ids, args.row_adapters, args.experts,
                                                                args.top_k, first, first_shrunk, second,
                                                                second_shrunk);
    if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  expand_kernel<<<dim3(positions, blocks_for(projections * out, kExpandThreads)), kExpandThreads, 0, stream>>>(
      grouped, args.ids, args.row_adapters, args.experts, args.top_k, out, projections, first, first_shrunk, second,
      second_shrunk, delta);
  return cudaGetLastError();
}

}  // namespace

int64_t moe_lora_max_tiles(int64_t assignments, int32_t experts) {
  return moe_tile_bound(assignments, experts, kGroupTileSlots);
}

cudaError_t moe_lora_deltas(const MoeLoraArgs& args, const MoeLoraWorkspace& workspace, ExpertDeltas& deltas,
                            cudaStream_t stream) {
  deltas = ExpertDeltas{};
  if (args.rows == 0) return cudaSuccess;
  const int64_t assignments = args.rows * args.top_k;
  if (assignments > INT32_MAX) return cudaErrorInvalidValue;
  if (workspace.grouped != nullptr) {
    // Positions past the grouped slots (those of valid expert ids) stay -1.
    if (cudaError_t status = cudaMemsetAsync(workspace.grouped, 0xff, sizeof(int32_t) * assignments, stream);
        status != cudaSuccess)
      return status;
    if (cudaError_t status = moe_group_slots(args.ids, assignments, args.experts, kGroupTileSlots,
                                             workspace.max_tiles, workspace.grouped, workspace.tiles, stream);
        status != cudaSuccess)
      return status;
  }
  if (args.gate.entries != nullptr || args.up.entries != nullptr) {
    ShrinkInput h;
    h.rows.f32 = args.h;
    h.divisor = args.top_k;
    h.width = args.hidden;
    if (cudaError_t status = shrink_expand(args, workspace.grouped, h, false, args.gate, workspace.shrunk_gate,
                                           args.up, workspace.shrunk_up, 2, args.intermediate, workspace.gate_up,
                                           stream);
        status != cudaSuccess)
      return status;
    deltas.gate_up = workspace.gate_up;
  }
  if (args.down.entries != nullptr) {
    deltas.down = workspace.down;
    deltas.compute_down = [args, workspace, stream](const SwigluRows& rows) {
      ShrinkInput x;
      x.rows = rows;
      x.width = args.intermediate;
      return shrink_expand(args, workspace.grouped, x, rows.f32 == nullptr, args.down, workspace.shrunk_down,
                           LoraTableView{}, nullptr, 1, args.hidden, workspace.down, stream);
    };
  }
  return cudaSuccess;
}

}  // namespace beamline::cuda

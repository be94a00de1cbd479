#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/lora/moe_lora.h"
#include "backend/cuda/moe/moe.h"

namespace beamline::cuda {
namespace {

constexpr int kTileSlots = 8;  // slots of one expert per weight-row pass
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// The adapter entry of slot s through expert e, or null (no adapter: slot -1, rank 0, no table).
__device__ __forceinline__ const int64_t* lora_entry(const LoraTableView& table, const int32_t* row_adapters,
                                                     int32_t experts, int32_t top_k, int32_t s, int32_t e) {
  if (table.entries == nullptr) return nullptr;
  const int32_t slot = row_adapters[s / top_k];
  if (slot < 0) return nullptr;
  const int64_t* entry = table.entries + (int64_t{slot} * experts + e) * 3;
  return entry[2] > 0 ? entry : nullptr;
}

// shrunk[s, r] = a_i[r] · x_s for each slot s with an adapter entry: one block per slot, a warp per rank row. x_s is
// h[s / top_k] (`per_token`) or x[s] (the activated rows).
__global__ void shrink_kernel(const float* x, bool per_token, int64_t in, const int32_t* ids, const int32_t* row_adapters,
                              int32_t experts, int32_t top_k, LoraTableView table, float* shrunk) {
  const int32_t s = blockIdx.x;
  const int32_t e = ids[s];
  if (e < 0 || e >= experts) return;
  const int64_t* entry = lora_entry(table, row_adapters, experts, top_k, s, e);
  if (entry == nullptr) return;
  const auto* a = reinterpret_cast<const float*>(entry[0]);
  const int64_t rank = entry[2];
  const float* xs = x + (per_token ? s / top_k : s) * in;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t r = warp; r < rank; r += kWarps) {
    float sum = 0.0f;
    for (int64_t k = lane; k < in; k += 32) sum += a[r * in + k] * xs[k];
    sum = warp_sum(sum);
    if (lane == 0) shrunk[int64_t{s} * table.max_rank + r] = sum;
  }
}

// Tile blockIdx.x of moe_group_slots' list: its expert (-1 past the listed tiles), how many slots and which.
struct TileSlots {
  int32_t expert, count;
  int32_t slots[kTileSlots];
};
__device__ __forceinline__ TileSlots read_tile(const int32_t* tiles, const int32_t* grouped) {
  const int32_t* tile = tiles + int64_t{blockIdx.x} * 4;
  TileSlots read{tile[0], tile[0] < 0 ? 0 : tile[2], {}};
  for (int j = 0; j < kTileSlots; ++j) read.slots[j] = j < read.count ? grouped[tile[1] + j] : 0;
  return read;
}

// b_i[o] · shrunk[s] over the entry's rank (0 without an entry).
__device__ __forceinline__ float expand(const int64_t* entry, int64_t o, const float* shrunk, int64_t max_rank,
                                        int32_t s) {
  if (entry == nullptr) return 0.0f;
  const auto* b = reinterpret_cast<const float*>(entry[1]);
  const int64_t rank = entry[2];
  float sum = 0.0f;
  for (int64_t r = 0; r < rank; ++r) sum += b[o * rank + r] * shrunk[int64_t{s} * max_rank + r];
  return sum;
}

// Gate|up of one tile of an expert's slots (grid.x: the tiles; grid.y: blocks of kWarps output rows): a warp per
// output row i, each weight row read once for the tile's slots;
// then each slot's LoRA on gate and up, and activated[s, i] = silu(gate) * up.
template <typename W>
__global__ void __launch_bounds__(kThreads) gate_up_kernel(MoeLoraArgs args, const int32_t* grouped,
                                                           const int32_t* tiles, const float* shrunk_gate,
                                                           const float* shrunk_up, float* activated) {
  const TileSlots tile = read_tile(tiles, grouped);
  const int32_t e = tile.expert, count = tile.count;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t i = int64_t{blockIdx.y} * kWarps + warp;
  if (e < 0 || i >= args.intermediate) return;
  const int32_t(&slots)[kTileSlots] = tile.slots;
  const auto* gate_w = static_cast<const W*>(args.expert_weights[e]) + i * args.hidden;
  const auto* up_w = static_cast<const W*>(args.expert_weights[args.experts + e]) + i * args.hidden;
  float gate[kTileSlots] = {}, up[kTileSlots] = {};
  for (int64_t k = lane; k < args.hidden; k += 32) {
    const float g = to_float(gate_w[k]), u = to_float(up_w[k]);
#pragma unroll
    for (int j = 0; j < kTileSlots; ++j) {
      if (j >= count) break;
      const float x = args.h[int64_t{slots[j] / args.top_k} * args.hidden + k];
      gate[j] += g * x;
      up[j] += u * x;
    }
  }
#pragma unroll
  for (int j = 0; j < kTileSlots; ++j) {
    gate[j] = warp_sum(gate[j]);
    up[j] = warp_sum(up[j]);
  }
  if (lane >= count) return;
  // Lane j finishes slot j (an array indexed by the lane would go to local memory: select by unrolled compare).
  float g = 0.0f, u = 0.0f;
  int32_t s = 0;
#pragma unroll
  for (int j = 0; j < kTileSlots; ++j)
    if (j == lane) {
      g = gate[j];
      u = up[j];
      s = slots[j];
    }
  g += expand(lora_entry(args.gate, args.row_adapters, args.experts, args.top_k, s, e), i, shrunk_gate,
              args.gate.max_rank, s);
  u += expand(lora_entry(args.up, args.row_adapters, args.experts, args.top_k, s, e), i, shrunk_up,
              args.up.max_rank, s);
  activated[int64_t{s} * args.intermediate + i] = silu(g) * u;
}

// Down of one tile: a warp per output row o; each slot's LoRA on down, then its routing weight.
template <typename W>
__global__ void __launch_bounds__(kThreads) down_kernel(MoeLoraArgs args, const int32_t* grouped, const int32_t* tiles,
                                                        const float* activated, const float* shrunk_down,
                                                        float* expert_out) {
  const TileSlots tile = read_tile(tiles, grouped);
  const int32_t e = tile.expert, count = tile.count;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t o = int64_t{blockIdx.y} * kWarps + warp;
  if (e < 0 || o >= args.hidden) return;
  const int32_t(&slots)[kTileSlots] = tile.slots;
  const auto* down_w = static_cast<const W*>(args.expert_weights[2 * int64_t{args.experts} + e]) + o * args.intermediate;
  float sum[kTileSlots] = {};
  for (int64_t k = lane; k < args.intermediate; k += 32) {
    const float w = to_float(down_w[k]);
#pragma unroll
    for (int j = 0; j < kTileSlots; ++j) {
      if (j >= count) break;
      sum[j] += w * activated[int64_t{slots[j]} * args.intermediate + k];
    }
  }
#pragma unroll
  for (int j = 0; j < kTileSlots; ++j) sum[j] = warp_sum(sum[j]);
  if (lane >= count) return;
  float y = 0.0f;
  int32_t s = 0;
#pragma unroll
  for (int j = 0; j < kTileSlots; ++j)
    if (j == lane) {
      y = sum[j];
      s = slots[j];
    }
  y += expand(lora_entry(args.down, args.row_adapters, args.experts, args.top_k, s, e), o, shrunk_down,
              args.down.max_rank, s);
  expert_out[int64_t{s} * args.hidden + o] = args.weights[s] * y;
}

}  // namespace

int64_t moe_lora_max_tiles(int64_t assignments, int32_t experts) {
  return moe_tile_bound(assignments, experts, kTileSlots);
}

cudaError_t moe_lora(const MoeLoraArgs& args, const MoeLoraWorkspace& workspace, float* out, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  const int64_t assignments = args.rows * args.top_k;
  if (cudaError_t status = moe_group_slots(args.ids, assignments, args.experts, kTileSlots, workspace.max_tiles,
                                           workspace.grouped, workspace.tiles, stream);
      status != cudaSuccess)
    return status;
  const auto slots = static_cast<unsigned int>(assignments);
  if (args.gate.entries != nullptr)
    shrink_kernel<<<slots, kThreads, 0, stream>>>(args.h, true, args.hidden, args.ids, args.row_adapters, args.experts,
                                                  args.top_k, args.gate, workspace.shrunk_gate);
  if (args.up.entries != nullptr)
    shrink_kernel<<<slots, kThreads, 0, stream>>>(args.h, true, args.hidden, args.ids, args.row_adapters, args.experts,
                                                  args.top_k, args.up, workspace.shrunk_up);
  const auto tiles = static_cast<unsigned int>(workspace.max_tiles);
  const bool known = dispatch_float(args.dtype, [&](auto tag) {
    using W = decltype(tag);
    gate_up_kernel<W><<<dim3(tiles, blocks_for(args.intermediate, kWarps)), kThreads, 0, stream>>>(
        args, workspace.grouped, workspace.tiles, workspace.shrunk_gate, workspace.shrunk_up, workspace.activated);
    if (args.down.entries != nullptr)
      shrink_kernel<<<slots, kThreads, 0, stream>>>(workspace.activated, false, args.intermediate, args.ids,
                                                    args.row_adapters, args.experts, args.top_k, args.down,
                                                    workspace.shrunk_down);
    down_kernel<W><<<dim3(tiles, blocks_for(args.hidden, kWarps)), kThreads, 0, stream>>>(
        args, workspace.grouped, workspace.tiles, workspace.activated, workspace.shrunk_down, workspace.expert_out);
  });
  if (!known) return cudaErrorInvalidValue;
  if (cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  return moe_combine(workspace.expert_out, args.ids, args.rows, args.top_k, args.experts, args.hidden, out, stream);
}

}  // namespace beamline::cuda

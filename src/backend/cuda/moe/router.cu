// The FP32 router: its logits at decode and the group-limited sigmoid top-k, apart or in one launch.
// cuBLAS's F32 GEMV took 6.7 µs for Beam-1.0's router (256 × 5,120 F32, 5.2 MB: 1.1 µs of HBM) at one row, five times a
// step of the 8-layer model: here a block per expert reads its router row once, every 16-byte load of it in flight
// before the first multiply, and applies it to each of the few rows (h stays in L1/L2). The top-k then costs a launch
// of its own per MoE layer at decode, a fixed cost of a few µs whatever the rows: route_fused lets the last block of the
// GEMV do it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/moe/router.h"
#include "backend/cuda/rows/norm_row.cuh"

namespace beamline::cuda {
namespace {

// ---- logits ----
constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kChunksPerThread = 16;  // float4 chunks: rows of up to 256 * 16 * 4 = 16,384 values
constexpr int64_t kMaxHidden = int64_t{kGemvThreads} * kChunksPerThread * 4;

// This thread's float4 chunks c = threadIdx.x + k * blockDim.x of one router row, all loads in flight at once.
template <int kChunks>
__device__ __forceinline__ void load_router_row(const float4* __restrict__ weights, int64_t chunks,
                                                float4 (&w)[kChunks]) {
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
    w[k] = c < chunks ? weights[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// logits[r * experts] = h[r] · the router row held in w, for r < rows (<= kRouterGemvMaxRows), written by thread r.
// One barrier for all rows: each warp's sums go to shared memory, then the warps' are added in warp order (the same
// bits for a row whatever the other rows: --batch-invariant).
__device__ __forceinline__ void expert_logits(const float4* __restrict__ h, const float4 (&w)[kChunksPerThread],
                                              int64_t rows, int64_t chunks, int64_t experts,
                                              float* __restrict__ logits) {
  __shared__ float partial[kRouterGemvMaxRows][kGemvWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRouterGemvMaxRows; ++r) {
    if (r >= rows) break;
    const float4* x = h + r * chunks;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kChunksPerThread; ++k) {
      const int64_t c = threadIdx.x + int64_t{k} * kGemvThreads;
      if (c < chunks) {
        const float4 v = x[c];
        sum += v.x * w[k].x + v.y * w[k].y + v.z * w[k].z + v.w * w[k].w;
      }
    }
    sum = warp_sum(sum);
    if (lane == 0) partial[r][warp] = sum;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kGemvWarps; ++i) sum += partial[threadIdx.x][i];
    logits[threadIdx.x * experts] = sum;
  }
}

__global__ void __launch_bounds__(kGemvThreads)
    router_gemv_kernel(const float4* __restrict__ h, const float4* __restrict__ router, int64_t rows, int64_t chunks,
                       int64_t experts, float* __restrict__ logits) {
  const int64_t expert = blockIdx.x, first = int64_t{blockIdx.y} * kRouterGemvMaxRows;
  float4 w[kChunksPerThread];
  load_router_row(router + expert * chunks, chunks, w);
  expert_logits(h + first * chunks, w, min(rows - first, kRouterGemvMaxRows), chunks, experts,
                logits + first * experts + expert);
}

// ---- top-k ----
// One warp per row: nothing in the route needs more than a warp's shuffles, and a block-wide barrier per pick (what
// a block per row would need) costs more than the picks themselves. Lane l owns experts l, l + 32, l + 64, ...; its
// `taken` bit i marks expert l + 32 i.
constexpr int kRouteWarps = 2;  // rows per block of route_topk
constexpr int kMaxExpertsPerLane = kMaxRouterExperts / 32;
static_assert(kMaxExpertsPerLane <= 32, "a lane's taken experts are the bits of one word");
constexpr int kRouteSharedBytes = 48 * 1024;  // dynamic shared memory without an opt-in

// A warp's shared memory for one row: score and choice per expert, group scores, picks, taken groups.
struct RouteScratch {
  float *score, *choice, *group_score;
  int32_t* picked;
  bool* group_taken;
};

__host__ __device__ inline int64_t route_scratch_bytes(int32_t experts, const RouterChoice& choice) {
  const int64_t bytes = 4 * (2 * int64_t{experts} + choice.n_group + choice.top_k) + choice.n_group;
  return (bytes + 15) / 16 * 16;
}

__device__ inline RouteScratch warp_scratch(unsigned char* base, int warp, int32_t experts,
                                            const RouterChoice& choice) {
  RouteScratch s;
  s.score = reinterpret_cast<float*>(base + warp * route_scratch_bytes(experts, choice));
  s.choice = s.score + experts;
  s.group_score = s.choice + experts;
  s.picked = reinterpret_cast<int32_t*>(s.group_score + choice.n_group);
  s.group_taken = reinterpret_cast<bool*>(s.picked + choice.top_k);
  return s;
}

// An expert candidate; `better` orders by value, then the lower index (the reference's tie rule).
struct Candidate {
  float value;
  int32_t index;
};

// The comparisons below are written with bitwise operators and selects so that they compile to predicated code: the
// lanes of a warp disagree at every comparison, and short-circuit branches there serialised the warp's paths
// (24 us for one row's route, under ncu, before this).
__device__ __forceinline__ bool better(const Candidate& a, const Candidate& b) {
  return (a.value > b.value) | ((a.value == b.value) & (a.index < b.index));
}

// c in place of best when `allowed` and best is empty (index -1) or worse.
__device__ __forceinline__ Candidate keep_better(const Candidate& best, const Candidate& c, bool allowed) {
  const bool take = allowed & ((best.index < 0) | better(c, best));
  return {take ? c.value : best.value, take ? c.index : best.index};
}

__device__ __forceinline__ Candidate warp_best(Candidate c) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Candidate other{__shfl_xor_sync(0xffffffffu, c.value, offset), __shfl_xor_sync(0xffffffffu, c.index, offset)};
    c = keep_better(c, other, other.index >= 0);
  }
  return c;
}

// The sum of the best two of values[begin, end) (the best alone when there is one), in one pass by one thread.
__device__ float best_two_sum(const float* values, int32_t begin, int32_t end) {
  Candidate first{-INFINITY, -1}, second{-INFINITY, -1};
  for (int32_t i = begin; i < end; ++i) {
    const Candidate c{values[i], i};
    const bool beats_first = (first.index < 0) | better(c, first);
    const Candidate runner_up = keep_better(second, c, true);
    second = {beats_first ? first.value : runner_up.value, beats_first ? first.index : runner_up.index};
    first = {beats_first ? c.value : first.value, beats_first ? c.index : first.index};
  }
  return second.index < 0 ? first.value : first.value + second.value;
}

// One row's choice by one warp. Global memory is touched only at the start (the row's logits, through L2: route_fused's
// come from other blocks of the same launch, and the bias, unrolled so that the loads overlap) and at the end (the
// picks, written by all lanes at once): at decode, a dependent global access costs more than the whole selection in
// shared memory.
__device__ void route_row(const float* __restrict__ logits, const float* __restrict__ bias, int32_t experts,
                          const RouterChoice& c, const RouteScratch& s, int32_t* __restrict__ ids,
                          float* __restrict__ weights) {
  const int lane = threadIdx.x % 32;
#pragma unroll 8
  for (int32_t e = lane; e < experts; e += 32) {
    const float logit = __ldcg(logits + e);
    s.score[e] = 1.0f / (1.0f + expf(-logit));
    s.choice[e] = s.score[e] + bias[e];
  }
  __syncwarp();
  // Group score = the sum of its 2 best choices, one lane per group.
  const int32_t group_size = experts / c.n_group;
  for (int32_t g = lane; g < c.n_group; g += 32) {
    s.group_score[g] = best_two_sum(s.choice, g * group_size, (g + 1) * group_size);
    s.group_taken[g] = false;
  }
  __syncwarp();
  if (lane == 0) {
    for (int32_t pick = 0; pick < c.topk_group; ++pick) {
      int32_t best = -1;
      float best_score = -INFINITY;
      for (int32_t g = 0; g < c.n_group; ++g) {
        const float score_g = s.group_score[g];
        const bool take = !s.group_taken[g] & ((best < 0) | (score_g > best_score));
        best = take ? g : best;
        best_score = take ? score_g : best_score;
      }
      s.group_taken[best] = true;
    }
  }
  __syncwarp();
  for (int32_t e = lane; e < experts; e += 32)
    if (!s.group_taken[e / group_size]) s.choice[e] = -INFINITY;
  __syncwarp();
  // top_k rounds of a warp-wide argmax; the winner's owner marks it taken. Every lane holds the winner, so every lane
  // sums the picked scores in j order (the reference's order).
  uint32_t taken = 0;
  float total = 0.0f;
  for (int32_t j = 0; j < c.top_k; ++j) {
    Candidate best{-INFINITY, -1};
    for (int32_t i = 0, e = lane; e < experts; ++i, e += 32) {
      best = keep_better(best, Candidate{s.choice[e], e}, !(taken >> i & 1u));
    }
    best = warp_best(best);
    if (best.index % 32 == lane) taken |= 1u << (best.index / 32);
    if (lane == 0) s.picked[j] = best.index;
    total += s.score[best.index];
  }
  __syncwarp();
  for (int32_t j = lane; j < c.top_k; j += 32) {
    const int32_t id = s.picked[j];
    const float weight = c.norm_topk_prob ? s.score[id] / total : s.score[id];
    ids[j] = id;
    weights[j] = weight * c.routed_scaling_factor;
  }
}

__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t rows, int32_t experts,
                 RouterChoice choice, int32_t* __restrict__ expert_ids, float* __restrict__ expert_weights) {
  extern __shared__ __align__(16) unsigned char route_shared[];
  const int warp = threadIdx.x / 32;
  const int64_t row = int64_t{blockIdx.x} * kRouteWarps + warp;
  if (row >= rows) return;
  route_row(logits + row * experts, bias, experts, choice, warp_scratch(route_shared, warp, experts, choice),
            expert_ids + row * choice.top_k, expert_weights + row * choice.top_k);
}

// ---- both in one launch ----
// The usual "last block" handshake over a grid's blocks: each block's global writes are fenced before its arrival is
// counted, and the block that sees the full count fences again before it reads what the others wrote. True in the
// last block only (every thread of it); the caller's last block sets *arrivals back to 0 for the next launch.
__device__ __forceinline__ bool last_to_arrive(uint32_t* arrivals) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

// A block per expert as router_gemv_kernel; the last block to finish its logits routes the rows (route_warps warps of
// it, a row each in turn).
__global__ void __launch_bounds__(kGemvThreads)
    route_fused_kernel(const float4* __restrict__ h, const float4* __restrict__ router, const float* __restrict__ bias,
                       int64_t rows, int64_t chunks, int32_t experts, RouterChoice choice, int route_warps,
                       float* __restrict__ logits, uint32_t* __restrict__ arrivals, int32_t* __restrict__ expert_ids,
                       float* __restrict__ expert_weights) {
  extern __shared__ __align__(16) unsigned char route_shared[];
  const int64_t expert = blockIdx.x;
  float4 w[kChunksPerThread];
  load_router_row(router + expert * chunks, chunks, w);
  expert_logits(h, w, rows, chunks, experts, logits + expert);
  if (!last_to_arrive(arrivals)) return;
  const int warp = threadIdx.x / 32;
  if (warp < route_warps) {
    const RouteScratch scratch = warp_scratch(route_shared, warp, experts, choice);
    for (int64_t row = warp; row < rows; row += route_warps)
      route_row(logits + row * experts, bias, experts, choice, scratch, expert_ids + row * choice.top_k,
                expert_weights + row * choice.top_k);
  }
  if (threadIdx.x == 0) *arrivals = 0;  // the next launch, in stream order, starts from 0
}

// ---- the norms before the router, folded in (one row) ----
// At decode the residual add after attention and the MoE's input norm are one row: a block of one SM, a launch and a
// memory latency of their own before the router's 256 blocks start. Here every block of the router computes the row
// itself (60 KB from L2 per block) and applies it to its experts; the last block to arrive writes the residual and the
// normed row (only then: the others read the old residual) and routes.
// A block of the fewest warps whose threads hold a row at kFoldChunks float4 chunks each (Beam-1.0: 320 threads, two
// blocks an SM, its 256 experts in one wave on 132 SMs).
constexpr int kFoldChunks = 4;
constexpr int kFoldValues = 4 * kFoldChunks;
constexpr int kFoldMaxThreads = 512;
constexpr int64_t kMaxFoldHidden = int64_t{kFoldMaxThreads} * kFoldValues;  // 8,192

// Values 4c..4c+3 of a row for this thread's chunks c = threadIdx.x + k * blockDim.x, at values[4k..4k+3] (0 past
// the row's end).
template <typename T>
__device__ __forceinline__ void load_chunked(const T* __restrict__ row, int64_t chunks, float (&values)[kFoldValues]) {
#pragma unroll
  for (int k = 0; k < kFoldChunks; ++k) {
    const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
    if constexpr (std::is_same_v<T, float>) {  // the rows; the weights are BF16 or F16
      const float4 v = c < chunks ? reinterpret_cast<const float4*>(row)[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      values[4 * k] = v.x, values[4 * k + 1] = v.y, values[4 * k + 2] = v.z, values[4 * k + 3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) values[4 * k + j] = c < chunks ? to_float(row[4 * c + j]) : 0.0f;
    }
  }
}

__device__ __forceinline__ void store_chunked(const float (&values)[kFoldValues], int64_t chunks,
                                              float* __restrict__ row) {
#pragma unroll
  for (int k = 0; k < kFoldChunks; ++k) {
    const int64_t c = threadIdx.x + int64_t{k} * blockDim.x;
    if (c < chunks) {
      const float* v = values + 4 * k;
      reinterpret_cast<float4*>(row)[c] = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
}

// At most 96 registers a thread, so that two blocks of 320 threads share an SM.
template <typename W>
__global__ void __maxnreg__(96)
    add_norm_route_kernel(float* __restrict__ residual, const float* __restrict__ y, const W* __restrict__ weight,
                          const W* __restrict__ next_weight, float eps, float scale, int64_t hidden,
                          float* __restrict__ out, const float4* __restrict__ router, const float* __restrict__ bias,
                          int32_t experts, RouterChoice choice, float* __restrict__ logits,
                          uint32_t* __restrict__ arrivals, int32_t* __restrict__ expert_ids,
                          float* __restrict__ expert_weights) {
  extern __shared__ __align__(16) unsigned char route_shared[];
  const int64_t chunks = hidden / 4;
  float4 w[kFoldChunks];
  load_router_row(router + int64_t{blockIdx.x} * chunks, chunks, w);  // in flight during the norms
  float values[kFoldValues], scales[kFoldValues], sums[kFoldValues];
  load_chunked(y, chunks, values);
  load_chunked(weight, chunks, scales);
  load_chunked(residual, chunks, sums);
  add_scaled_norm(sums, values, inverse_rms_owned(values, hidden, eps), scales, scale);
  load_chunked(next_weight, chunks, scales);
  const float next_inverse = inverse_rms_owned(sums, hidden, eps);
#pragma unroll
  for (int i = 0; i < kFoldValues; ++i) values[i] = sums[i] * next_inverse * scales[i];  // the normed row
  for (int64_t expert = blockIdx.x; expert < experts; expert += gridDim.x) {
    if (expert != blockIdx.x) load_router_row(router + expert * chunks, chunks, w);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kFoldChunks; ++k) {
      const float* v = values + 4 * k;
      sum += v[0] * w[k].x + v[1] * w[k].y + v[2] * w[k].z + v[3] * w[k].w;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) logits[expert] = sum;
  }
  if (!last_to_arrive(arrivals)) return;
  store_chunked(sums, chunks, residual);
  store_chunked(values, chunks, out);
  if (threadIdx.x < 32)
    route_row(logits, bias, experts, choice, warp_scratch(route_shared, 0, experts, choice), expert_ids,
              expert_weights);
  if (threadIdx.x == 0) *arrivals = 0;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool choice_supported(int32_t experts, const RouterChoice& choice) {
  return experts > 0 && experts <= kMaxRouterExperts && choice.n_group > 0 && experts % choice.n_group == 0 &&
         choice.topk_group > 0 && choice.topk_group <= choice.n_group && choice.top_k > 0 &&
         choice.top_k <= experts && route_scratch_bytes(experts, choice) * kRouteWarps <= kRouteSharedBytes;
}

}  // namespace

bool router_gemv_supported(const float* h, const float* router, int64_t hidden) {
  return hidden % 4 == 0 && hidden <= kMaxHidden && aligned16(h) && aligned16(router);
}

cudaError_t router_gemv(const float* h, const float* router, int64_t rows, int64_t hidden, int64_t experts,
                        float* logits, cudaStream_t stream) {
  if (rows == 0 || experts == 0) return cudaSuccess;
  const int64_t tiles = (rows + kRouterGemvMaxRows - 1) / kRouterGemvMaxRows;
  if (!router_gemv_supported(h, router, hidden) || tiles > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(experts), static_cast<unsigned int>(tiles));
  router_gemv_kernel<<<grid, kGemvThreads, 0, stream>>>(
      reinterpret_cast<const float4*>(h), reinterpret_cast<const float4*>(router), rows, hidden / 4, experts, logits);
  return cudaGetLastError();
}

cudaError_t route_topk(const float* logits, const float* bias, int64_t rows, int32_t experts,
                       const RouterChoice& choice, int32_t* expert_ids, float* expert_weights, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!choice_supported(experts, choice)) return cudaErrorInvalidValue;
  const auto shared = static_cast<size_t>(route_scratch_bytes(experts, choice) * kRouteWarps);
  route_kernel<<<blocks_for(rows, kRouteWarps), kRouteWarps * 32, shared, stream>>>(logits, bias, rows, experts, choice,
                                                                                    expert_ids, expert_weights);
  return cudaGetLastError();
}

cudaError_t route_fused(const float* h, const float* router, const float* bias, int64_t rows, int64_t hidden,
                        int32_t experts, const RouterChoice& choice, float* logits, uint32_t* arrivals,
                        int32_t* expert_ids, float* expert_weights, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > kRouterGemvMaxRows || !router_gemv_supported(h, router, hidden) || !choice_supported(experts, choice))
    return cudaErrorInvalidValue;
  // As many routing warps as the rows can use and the shared memory holds (at least kRouteWarps: choice_supported).
  const int64_t per_warp = route_scratch_bytes(experts, choice);
  const int route_warps = static_cast<int>(std::min<int64_t>({rows, kGemvWarps, kRouteSharedBytes / per_warp}));
  route_fused_kernel<<<static_cast<unsigned int>(experts), kGemvThreads, static_cast<size_t>(per_warp * route_warps),
                       stream>>>(reinterpret_cast<const float4*>(h), reinterpret_cast<const float4*>(router), bias,
                                 rows, hidden / 4, experts, choice, route_warps, logits, arrivals, expert_ids,
                                 expert_weights);
  return cudaGetLastError();
}

bool add_rms_norm_then_route_supported(const float* residual, const float* y, const float* out, const float* router,
                                       DType weight_dtype, int64_t hidden, int32_t experts,
                                       const RouterChoice& choice) {
  return (weight_dtype == DType::BF16 || weight_dtype == DType::F16) && hidden % 4 == 0 && hidden <= kMaxFoldHidden &&
         aligned16(residual) && aligned16(y) && aligned16(out) &&
         aligned16(router) && choice_supported(experts, choice);
}

cudaError_t add_rms_norm_then_route(float* residual, const float* y, const void* weight, const void* next_weight,
                                    DType weight_dtype, float eps, float scale, int64_t hidden, float* out,
                                    const float* router, const float* bias, int32_t experts, const RouterChoice& choice,
                                    float* logits, uint32_t* arrivals, int32_t* expert_ids, float* expert_weights,
                                    cudaStream_t stream) {
  if (!add_rms_norm_then_route_supported(residual, y, out, router, weight_dtype, hidden, experts, choice))
    return cudaErrorInvalidValue;
  cudaError_t status = cudaErrorInvalidValue;
  const auto shared = static_cast<size_t>(route_scratch_bytes(experts, choice));
  const int64_t warps = (hidden / 4 + 32 * kFoldChunks - 1) / (32 * kFoldChunks);
  const auto threads = static_cast<int>(std::max<int64_t>(warps, 1) * 32);
  const auto launch = [&](auto tag) {
    using W = decltype(tag);
    const auto kernel = add_norm_route_kernel<W>;
    // One wave: a block per expert while they all fit at once, else each block takes several experts (the arrival
    // count needs every block to finish, not to be resident, but a second wave would pay the norms again).
    int device = 0, sms = 0, per_sm = 0;
    if ((status = cudaGetDevice(&device)) != cudaSuccess) return;
    if ((status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return;
    if ((status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared)) != cudaSuccess)
      return;
    const int blocks = std::max(1, std::min(experts, sms * std::max(per_sm, 1)));
    kernel<<<static_cast<unsigned int>(blocks), threads, shared, stream>>>(
        residual, y, static_cast<const W*>(weight), static_cast<const W*>(next_weight), eps, scale, hidden, out,
        reinterpret_cast<const float4*>(router), bias, experts, choice, logits, arrivals, expert_ids, expert_weights);
    status = cudaGetLastError();
  };
  if (weight_dtype == DType::BF16)
    launch(__nv_bfloat16{});
  else
    launch(__half{});
  return status;
}

}  // namespace beamline::cuda

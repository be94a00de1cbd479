// The BF16 shadow that lets the tensor-core prefill kernels (BF16 pools only) serve FP8 pools: before a step's
// prefill tiles run, the pool blocks their keys see are widened E4M3 -> BF16 (exact: every E4M3 value is a BF16
// value) into a compact pool of one slot, numbered per sequence from its ShadowSequence::base. The kernels then
// compute exactly what they compute over a BF16 pool holding the same values. The widening moves 6 bytes per key
// and kv-head dimension (2 read, 4 written) where the prefill kernel does 4 x (the chunk's query heads) FLOPs on
// each: small for chunks of thousands of tokens (docs/long-context.md).
#include <cuda_fp8.h>

#include "backend/cuda/attention/attention_common.cuh"

namespace beamline::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void shadow_table_kernel(PoolGeometry pool, BatchGeometry batch, const int32_t* parts, int64_t entries,
                                    int32_t* shadow_table) {
  const int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (index >= entries) return;
  const int64_t sequence = index / batch.table_width, entry = index % batch.table_width;
  const int32_t base = parts[kShadowFields * sequence], first = parts[kShadowFields * sequence + 1],
                blocks = parts[kShadowFields * sequence + 2];
  int32_t shadow_block = -1;
  if (entry >= first && entry < int64_t{first} + blocks) {
    const int32_t block = batch.block_table[index];
    if (block >= 0 && block < pool.num_blocks) shadow_block = base + static_cast<int32_t>(entry - first);
  }
  shadow_table[index] = shadow_block;
}

// 8 E4M3 codes to 8 BF16 values, exactly.
__device__ __forceinline__ uint4 widen8(uint2 codes) {
  const uint32_t words[2] = {codes.x, codes.y};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
    const __half2 halves(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
    const __nv_bfloat162 widened = __float22bfloat162_rn(__half22float2(halves));
    out[i] = *reinterpret_cast<const uint32_t*>(&widened);
  }
  return {out[0], out[1], out[2], out[3]};
}

// One CUDA block per shadow block: finds its sequence (bases never decrease over the sequences), then copies the
// pool block's slot, K and V, 8 values per thread and step.
__global__ void widen_kernel(PoolGeometry pool, int32_t slot, BatchGeometry batch, const int32_t* parts,
                             int32_t sequences, ShadowBuffers shadow) {
  const int32_t shadow_block = static_cast<int32_t>(blockIdx.x);
  int32_t low = 0, high = sequences;  // the last sequence whose base <= shadow_block
  while (high - low > 1) {
    const int32_t middle = (low + high) / 2;
    (parts[kShadowFields * middle] <= shadow_block ? low : high) = middle;
  }
  const int64_t entry = parts[kShadowFields * low + 1] + int64_t{shadow_block - parts[kShadowFields * low]};
  if (entry >= batch.table_width) return;
  const int32_t block = batch.block_table[int64_t{low} * batch.table_width + entry];
  if (block < 0 || block >= pool.num_blocks) return;  // the shadow table says -1 there
  const int64_t chunks = int64_t{pool.block_size} * pool.num_kv_heads * pool.head_dim / 8;
  const int64_t source = (int64_t{block} * pool.slots_per_block + slot) * chunks;
  const int64_t destination = int64_t{shadow_block} * chunks;
  for (int64_t chunk = threadIdx.x; chunk < chunks; chunk += blockDim.x) {
    static_cast<uint4*>(shadow.k)[destination + chunk] = widen8(static_cast<const uint2*>(pool.k)[source + chunk]);
    static_cast<uint4*>(shadow.v)[destination + chunk] = widen8(static_cast<const uint2*>(pool.v)[source + chunk]);
  }
}

__global__ void multiply_kernel(const float* in, float* out, int64_t n, const float* factor) {
  const int64_t index = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (index < n) out[index] = in[index] * *factor;
}

}  // namespace

cudaError_t multiply_by_device_scalar(const float* in, float* out, int64_t n, const float* factor, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (in == nullptr || out == nullptr || factor == nullptr) return cudaErrorInvalidValue;
  multiply_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(in, out, n, factor);
  return cudaGetLastError();
}

cudaError_t widen_to_shadow(const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch, const int32_t* parts,
                            int32_t sequences, int64_t shadow_blocks, const ShadowBuffers& shadow,
                            cudaStream_t stream) {
  if (pool.dtype != DType::F8_E4M3 || (int64_t{pool.num_kv_heads} * pool.head_dim) % 8 != 0 || sequences <= 0)
    return cudaErrorInvalidValue;
  const int64_t entries = int64_t{sequences} * batch.table_width;
  if (entries > 0)
    shadow_table_kernel<<<blocks_for(entries, kThreads), kThreads, 0, stream>>>(pool, batch, parts, entries,
                                                                                shadow.block_table);
  if (shadow_blocks > 0 && shadow_blocks <= INT32_MAX)
    widen_kernel<<<static_cast<unsigned int>(shadow_blocks), kThreads, 0, stream>>>(pool, slot, batch, parts, sequences,
                                                                                   shadow);
  return cudaGetLastError();
}

}  // namespace beamline::cuda

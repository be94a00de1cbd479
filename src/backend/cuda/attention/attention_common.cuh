#pragma once
// Shared by the paged-attention kernels (attention/*.cu): pool addressing and the launchers of each path.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/attention/attention.h"
#include "kv/kv_cache_layout.h"

namespace beamline::cuda {

// An element of an FP8 pool (--kv-cache-dtype fp8): E4M3 codes of x / scale (the layer's k_scale or v_scale,
// PoolGeometry::scales), written with round to nearest even and saturation at ±448 (quant/element_codes.h's
// f32_to_e4m3, as the CPU backend writes it) and read back exactly (E4M3 is a subset of F16); the kernels multiply
// by the scale where they use the values.
struct E4m3 {
  __nv_fp8_storage_t bits;
};
__device__ __forceinline__ float to_float(E4m3 v) {
  const __half_raw raw = __nv_cvt_fp8_to_halfraw(v.bits, __NV_E4M3);
  return __half2float(__half(raw));
}
template <>
__host__ __device__ __forceinline__ E4m3 from_float<E4m3>(float v) {
  return {__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)};
}

// The layer's k_scale (which 0) or v_scale (1) of an E4M3 pool, 1.0 when the pool has none.
__device__ __forceinline__ float kv_scale(const PoolGeometry& pool, int which) {
  return pool.scales != nullptr ? pool.scales[which] : 1.0f;
}

// The pool block holding `position` of `sequence`, or -1 when the table has none (given back, or past the table).
__device__ __forceinline__ int32_t lookup_block(const PoolGeometry& pool, const BatchGeometry& batch, int32_t sequence,
                                                int64_t position) {
  const int64_t index = position / pool.block_size;
  if (index >= batch.table_width) return -1;
  const int32_t block = batch.block_table[int64_t{sequence} * batch.table_width + index];
  return block < pool.num_blocks ? block : -1;
}

__device__ __forceinline__ int64_t pool_offset(const PoolGeometry& pool, int32_t block, int32_t slot, int64_t position,
                                               int32_t kv_head) {
  return kv_pool_offset(block, slot, position % pool.block_size, kv_head, pool.slots_per_block, pool.block_size,
                        pool.num_kv_heads, pool.head_dim);
}

// One sequence's keys of one kv head and layer slot, for the fast kernels: the block size is a power of two, so
// a position splits into table index and offset in the block by shift and mask (no division in the key loops).
struct KeyRows {
  const int32_t* table;  // the sequence's block-table row
  int32_t table_width, num_blocks, shift, mask;
  int64_t block_stride, slot_offset, position_stride;  // in pool elements

  // The block holding position t, or -1 when the table has none.
  __device__ __forceinline__ int32_t block_of(int32_t t) const {
    const int32_t index = t >> shift;
    if (index >= table_width) return -1;
    const int32_t block = table[index];
    return block >= 0 && block < num_blocks ? block : -1;
  }
  __device__ __forceinline__ int64_t offset(int32_t block, int32_t t) const {
    return block * block_stride + slot_offset + (t & mask) * position_stride;
  }
};

__device__ __forceinline__ KeyRows key_rows(const PoolGeometry& pool, const BatchGeometry& batch, int32_t sequence,
                                            int32_t slot, int32_t kv_head) {
  KeyRows rows;
  rows.table = batch.block_table + int64_t{sequence} * batch.table_width;
  rows.table_width = batch.table_width;
  rows.num_blocks = pool.num_blocks;
  rows.shift = __ffs(pool.block_size) - 1;
  rows.mask = pool.block_size - 1;
  rows.position_stride = int64_t{pool.num_kv_heads} * pool.head_dim;
  rows.block_stride = int64_t{pool.slots_per_block} * pool.block_size * rows.position_stride;
  rows.slot_offset = int64_t{slot} * pool.block_size * rows.position_stride + int64_t{kv_head} * pool.head_dim;
  return rows;
}

// 16 pool bytes as floats: 8 BF16 values (exact: a BF16 is the top half of an F32) or 4 F32 values.
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[8]) {
  const unsigned int words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[4]) {
  out[0] = __uint_as_float(raw.x);
  out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z);
  out[3] = __uint_as_float(raw.w);
}

// Streaming 16-byte load of pool data (read once per kernel: keep it out of L1).
__device__ __forceinline__ uint4 load_stream(const void* address) {
  return __ldcs(static_cast<const uint4*>(address));
}

__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// The fast paths cover head_dim 128 (Beam-1.0), up to 8 query heads per kv head and power-of-two block sizes;
// AttentionPlan::generic sends other shapes to the one-block-per-(row, kv head) kernel.
constexpr int32_t kFastHeadDim = 128;
constexpr int32_t kFastMaxGroup = 8;

cudaError_t launch_generic_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                                     int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                     cudaStream_t stream);
// Split-KV decode: rows `rows` (or 0..count-1 when null), `splits` key ranges each, merged into `out`.
cudaError_t launch_decode_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                                    const int32_t* rows, int64_t count, int32_t splits, float* partials,
                                    int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                    cudaStream_t stream);
// Floats of split-KV scratch launch_decode_attention needs (0 for one split).
int64_t decode_partials_floats(int64_t count, int32_t num_heads, int32_t splits);
// Resident decode blocks per multiprocessor for this pool dtype and group (the split heuristic's wave size).
int decode_blocks_per_multiprocessor(DType dtype, int32_t group);
// Query rows of one prefill tile for this many query heads per kv head and this pool dtype.
int32_t prefill_rows_per_tile(int32_t group, DType dtype);
// Tiled prefill over `tiles` work items (sequence, first row, rows) of `tile_list`: for BF16 pools the wgmma
// kernel with Bf16 operands or the mma.sync kernel with Split ones, the CUDA-core kernel (exact F32 math) for F32
// pools.
cudaError_t launch_prefill_attention(const float* q, const PoolGeometry& pool, int32_t slot,
                                     const BatchGeometry& batch, const int32_t* tile_list, int64_t tiles,
                                     int32_t num_heads, float scale, int32_t sliding_window,
                                     OperandPrecision precision, float* out, cudaStream_t stream);
// FP8 pools' prefill (AttentionPlan::shadow_blocks): widens the pool blocks of slot `slot` that `parts` (one
// ShadowSequence per each of the batch's `sequences`, on the device) name into `shadow`'s BF16 blocks, exactly, and
// writes the shadow's block table (-1 where the pool's table has no block, as the kernels expect of a missing block).
cudaError_t widen_to_shadow(const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch, const int32_t* parts,
                            int32_t sequences, int64_t shadow_blocks, const ShadowBuffers& shadow,
                            cudaStream_t stream);
// out[i] = in[i] * *factor for i < n (in may be out): the KV scales, which live on the device, applied around the
// prefill kernels that read an FP8 pool's unscaled shadow.
cudaError_t multiply_by_device_scalar(const float* in, float* out, int64_t n, const float* factor, cudaStream_t stream);
// Query vectors ((row, head of the group) pairs) per block of the tensor-core prefill kernels, which serve the
// same tiles.
constexpr int32_t kPrefillTileVectors = 128;
// The mma.sync prefill kernel (attention/prefill_mma.cu): BF16 pools and OperandPrecision::Split, tiles of
// prefill_mma_rows_per_tile(group) rows.
int32_t prefill_mma_rows_per_tile(int32_t group);
cudaError_t launch_prefill_attention_mma(const float* q, const PoolGeometry& pool, int32_t slot,
                                         const BatchGeometry& batch, const int32_t* tile_list, int64_t tiles,
                                         int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                         cudaStream_t stream);
// The wgmma prefill kernel (attention/prefill_wgmma.cu, sm_90a): BF16 pools and OperandPrecision::Bf16,
// the same tiles as the mma.sync kernel.
cudaError_t launch_prefill_attention_wgmma(const float* q, const PoolGeometry& pool, int32_t slot,
                                           const BatchGeometry& batch, const int32_t* tile_list, int64_t tiles,
                                           int32_t num_heads, float scale, int32_t sliding_window, float* out,
                                           cudaStream_t stream);

}  // namespace beamline::cuda

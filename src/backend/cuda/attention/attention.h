#pragma once
// Paged KV writes and paged attention, with the host-side plan that picks the kernels (attention.cu dispatches to
// decode.cu, prefill.cu, prefill_mma.cu, prefill_wgmma.cu), the block drafter's attention (block.cu), and the KV
// scales' amax (kv_scales.cu).
// Conventions: backend/cuda/common/operand_precision.h.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/common/operand_precision.h"
#include "tensor/dtype.h"

namespace beamline::cuda {

struct PoolGeometry {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F32;  // F32, BF16 or F8_E4M3
  // E4M3 pools: the layer's (k_scale, v_scale) on the device (PagedKvPool::scales), read by every kernel at run
  // time, so that recorded graphs see scales set after they were recorded; null: 1.0. Null for other dtypes.
  const float* scales = nullptr;
  int32_t num_blocks = 0, slots_per_block = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
};

struct BatchGeometry {
  const int32_t* positions = nullptr;     // [rows]
  const int32_t* row_sequence = nullptr;  // [rows]
  const int32_t* seq_lens = nullptr;      // [sequences]
  const int32_t* block_table = nullptr;   // [sequences, table_width]
  int64_t rows = 0;
  int32_t table_width = 0;
};

// Rows whose block is missing or out of the pool are skipped by write_kv and make paged_attention write NaN
// for that row and head (the CPU backend throws there; a device cannot without a host synchronisation).
cudaError_t write_kv(const float* k, const float* v, const PoolGeometry& pool, int32_t slot,
                     const BatchGeometry& batch, cudaStream_t stream);

// out[0] = max|x| / divisor over n floats, NaN skipped; 1.0 when the maximum is 0 or infinite (Backend::amax_scale).
cudaError_t amax_scale(const float* x, int64_t n, float divisor, float* out, cudaStream_t stream);

// Host-side facts of a batch (AttentionBatch's host copies) from which paged_attention's kernels are chosen.
struct AttentionHostBatch {
  const int32_t* query_start = nullptr;  // [sequences + 1]
  const int32_t* positions = nullptr;    // [rows]
  const int32_t* seq_lens = nullptr;     // [sequences]
  int32_t sequences = 0;
  int64_t rows = 0;
};

// Sequences with at most this many query rows (decode, short speculative chunks) take the split-KV decode
// kernel; longer ones the tiled prefill kernel (on the tensor cores for BF16 pools: q and P as `precision`
// operands, K and V exact).
constexpr int32_t kDecodeMaxQueryRows = 4;

// The kernels paged_attention runs for one batch, chosen on the host from AttentionHostBatch (no device read).
struct AttentionPlan {
  bool generic = false;  // head_dim != 128, > 8 query heads per kv head, block size not a power of two or
                         // unaligned q/out: the one-block-per-(row, kv head) kernel
  int64_t decode_rows = 0;     // rows of the split-KV decode kernel
  bool decode_rows_listed = false;  // they are work[0, decode_rows) (else rows 0 .. decode_rows - 1)
  int32_t splits = 1;          // key ranges per (decode row, kv head)
  int64_t prefill_tiles = 0;   // (sequence, first row, rows) triples in work after the decode rows
  std::vector<int32_t> work;   // for the caller to upload (empty when nothing needs listing)
  int64_t scratch_floats = 0;  // F32 scratch for the split-KV partial results
  OperandPrecision precision = OperandPrecision::Split;  // of the tensor-core prefill kernel (BF16 pools)
  // FP8 pools with prefill tiles: the keys those tiles see are first widened (exactly) into a BF16 shadow pool of
  // one slot and shadow_blocks blocks, which the tensor-core prefill kernels read; decode rows read the FP8 pool.
  // `work` then ends with kShadowFields entries per sequence (ShadowSequence; blocks 0 for a sequence without tiles).
  int64_t shadow_blocks = 0;
  int32_t shadow_sequences = 0;  // ShadowSequence entries in `work` (the batch's sequences)
};
// A sequence's part of the BF16 shadow pool: its block-table entries [first_block, first_block + blocks) are
// widened into shadow blocks [base, base + blocks).
struct ShadowSequence {
  int32_t base, first_block, blocks;
};
constexpr int32_t kShadowFields = 3;
// The shadow's device memory, from the caller: K and V [shadow_blocks, block_size, kv_heads, head_dim] BF16 each,
// and a block table [sequences, table_width] in its numbering.
struct ShadowBuffers {
  void* k = nullptr;
  void* v = nullptr;
  int32_t* block_table = nullptr;
  // A pool with KV scales (PoolGeometry::scales): q times k_scale, as many floats as q, since the shadow holds the
  // codes widened exactly, unscaled.
  float* scaled_q = nullptr;
};
AttentionPlan plan_attention(const AttentionHostBatch& batch, const PoolGeometry& pool, int32_t num_heads,
                             int32_t sliding_window, bool aligned, OperandPrecision precision);
// `work` is plan.work on the device, `scratch` plan.scratch_floats floats, `shadow` the buffers of
// plan.shadow_blocks (unused when 0).
cudaError_t paged_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& batch,
                            const AttentionPlan& plan, const int32_t* work, float* scratch, const ShadowBuffers& shadow,
                            int32_t num_heads, float scale, int32_t sliding_window, float* out, cudaStream_t stream);
// Backend::block_attention: `blocks` has one row per drafting sequence (seq_lens: the keys, the block the last
// `block` of them), q and out [block * sequences, num_heads * head_dim] block-row-major; attention/block.cu.
// head_dim must be a multiple of 4 up to kMaxAttentionHeadDim (block_attention_supported); any group.
bool block_attention_supported(int32_t head_dim);
cudaError_t block_attention(const float* q, const PoolGeometry& pool, int32_t slot, const BatchGeometry& blocks,
                            int32_t block, int32_t num_heads, float scale, int32_t sliding_window, float* out,
                            cudaStream_t stream);
constexpr int32_t kMaxAttentionHeadDim = 256;
constexpr int32_t kMaxAttentionGroup = 32;  // query heads per kv head

}  // namespace beamline::cuda

#pragma once
// FP8 block-128 projections of many rows through cuBLASLt's block-scaled matmul (cuBLAS 12.9 and later, Hopper only):
// the weight's F32 scale per 128x128 block (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) and the activations' per token
// and 128 channels (VEC128_32F) are applied inside the main loop with FP32 accumulation, the same W8A8 sums as
// fp8.h's wgmma GEMMs (DeepSeek-V3's scheme). Host code; the handle and a cache of the heuristic's algorithm per shape.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

namespace beamline::cuda::fp8 {

class BlockScaledGemm {
 public:
  // workspace: device memory cuBLASLt may use (shared with the backend's cuBLAS handle; both run on one stream).
  BlockScaledGemm(void* workspace, std::size_t workspace_bytes);
  ~BlockScaledGemm();
  BlockScaledGemm(const BlockScaledGemm&) = delete;
  BlockScaledGemm& operator=(const BlockScaledGemm&) = delete;

  // Whether cuBLASLt computes y [rows, out] for these sizes: the library is 12.9 or later, rows a multiple of 4 (the
  // activation scales' leading dimension), ceil(in / 128) a multiple of 4 (the weight scales' leading dimension, as
  // the checkpoint stores them), in a multiple of 16, out of 4 (16-byte rows), and its heuristic offers an algorithm
  // (asked once per shape, on the host).
  bool supports(int64_t rows, int64_t in, int64_t out);

  // y[r, o] = sum over k blocks b of xs[b, r] ws[o / 128, b] sum_{k in b} xq[r, k] w[o, k]. xq [rows, in] E4M3 with
  // xs [ceil(in / 128), rows] token-major (quantize_rows_token_major); weight [out, in] E4M3 with weight_scale
  // [ceil(out / 128), ceil(in / 128)] F32; y [rows, out] F32; every pointer 16-byte aligned. supports() first.
  cublasStatus_t linear(const uint8_t* xq, const float* xs, int64_t rows, int64_t in, const void* weight,
                        const float* weight_scale, int64_t out, float* y, cudaStream_t stream);

 private:
  struct Plan {
    bool found = false;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int64_t rows, int64_t in, int64_t out);

  cublasLtHandle_t handle_ = nullptr;
  bool library_has_block_scales_ = false;
  void* workspace_;
  std::size_t workspace_bytes_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace beamline::cuda::fp8

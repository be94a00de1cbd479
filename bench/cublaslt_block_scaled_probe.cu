// Which block-scaled FP8 matmuls cuBLASLt offers on this GPU (the question behind cuda/quant/fp8_cublaslt.h, whose
// heuristic returned no algorithm on the H200 on 2026-12-02): for Beam-1.0's projection shapes, every pairing of
// the output type (F32, BF16) and of which operand carries the 128x128 weight scales and which the 1x128 token scales,
// the status and algorithm count of cublasLtMatmulAlgoGetHeuristic, with the scale pointers left null (as
// fp8_cublaslt.cpp asks) and set to device buffers. No data is read.
// Build: nvcc -std=c++17 -o cublaslt_probe bench/cublaslt_block_scaled_probe.cu -lcublasLt -lcudart
// Run:   ./cublaslt_probe   (prints one line per case)
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>

namespace {

struct Case {
  const char* what;
  cudaDataType_t d_type;
  bool weight_is_a;  // A = weight [out, in] (TN: A transposed) with 128x128 scales; else A = activations
};

// Device scale buffers for the pointer attributes (large enough for every shape probed).
void* g_scales[2] = {};

void probe(cublasLtHandle_t handle, int64_t rows, int64_t in, int64_t out, const Case& c, bool pointers) {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  const cublasLtMatmulMatrixScale_t block = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const cublasLtMatmulMatrixScale_t vector = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const uint64_t m = static_cast<uint64_t>(c.weight_is_a ? out : rows), n = static_cast<uint64_t>(c.weight_is_a ? rows : out);
  const uint64_t k = static_cast<uint64_t>(in);
  cublasStatus_t status = cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep));
  const cublasLtMatmulMatrixScale_t a_mode = c.weight_is_a ? block : vector, b_mode = c.weight_is_a ? vector : block;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode));
  if (pointers && status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g_scales[0],
                                            sizeof(g_scales[0]));
  if (pointers && status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g_scales[1],
                                            sizeof(g_scales[1]));
  if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, m, k);
  if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, k, n, k);
  if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatrixLayoutCreate(&d, c.d_type, m, n, m);
  if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulPreferenceCreate(&preference);
  const size_t workspace = 32u << 20;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                  sizeof(workspace));
  cublasLtMatmulHeuristicResult_t results[4] = {};
  int returned = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle, operation, a, b, d, d, preference, 4, results, &returned);
  std::printf("| %lld x %lld x %lld | %s | %s | %s | %d |\n", static_cast<long long>(rows), static_cast<long long>(in),
              static_cast<long long>(out), c.what, pointers ? "set" : "null", cublasLtGetStatusName(status), returned);
  if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
  if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
  if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
  if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
  if (operation != nullptr) cublasLtMatmulDescDestroy(operation);
}

}  // namespace

int main() {
  cublasLtHandle_t handle = nullptr;
  if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasLtCreate failed\n");
    return 1;
  }
  for (void*& buffer : g_scales)
    if (cudaMalloc(&buffer, 8u << 20) != cudaSuccess) {
      std::printf("cudaMalloc failed\n");
      return 1;
    }
  std::printf("cuBLASLt %zu\n\n| rows x in x out | A / B scales, D | scale pointers | heuristic | algorithms |\n"
              "| --- | --- | --- | --- | --- |\n",
              cublasLtGetVersion());
  const Case cases[] = {{"A weight 128x128, B tokens 1x128, D F32 (fp8_cublaslt.h)", CUDA_R_32F, true},
                        {"A weight 128x128, B tokens 1x128, D BF16", CUDA_R_16BF, true},
                        {"A tokens 1x128, B weight 128x128, D F32", CUDA_R_32F, false},
                        {"A tokens 1x128, B weight 128x128, D BF16", CUDA_R_16BF, false}};
  for (const bool pointers : {false, true})
    for (const int64_t rows : {8, 1024, 8192})
      for (const Case& c : cases) probe(handle, rows, 5120, 6144, c, pointers);
  cublasLtDestroy(handle);
  return 0;
}

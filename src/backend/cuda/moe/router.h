#pragma once
// The router's logits for a few rows (decode): logits[r, e] = h[r] · router[e], F32 throughout (router_gemv.cu).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace beamline::cuda {

// Rows up to this many take router_gemv by default; more rows amortise a cuBLAS GEMM's launch and reuse the router
// tile. Each block applies its router row to up to this many rows, so more rows take more blocks (--batch-invariant
// sends every row count here: a row's logits do not depend on the other rows).
constexpr int64_t kRouterGemvMaxRows = 8;

// Whether router_gemv computes these shapes (hidden a multiple of 4 up to 16,384, and 16-byte aligned h and router);
// otherwise the caller uses a GEMM.
bool router_gemv_supported(const float* h, const float* router, int64_t hidden);

// logits [rows, experts] = h [rows, hidden] · router [experts, hidden]ᵀ, every row summed in the same order.
cudaError_t router_gemv(const float* h, const float* router, int64_t rows, int64_t hidden, int64_t experts,
                        float* logits, cudaStream_t stream);

}  // namespace beamline::cuda

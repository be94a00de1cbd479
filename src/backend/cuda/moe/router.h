#pragma once
// The FP32 noaux_tc router (Backend::route): its logits h · router[e] and the group-limited sigmoid top-k (router.cu).
// At decode both are one launch (route_fused); more rows take the logits from a GEMM (or router_gemv) and route_topk.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace beamline::cuda {

constexpr int32_t kMaxRouterExperts = 1024;

// Rows up to this many take router_gemv (or route_fused) by default; more rows amortise a cuBLAS GEMM's launch and
// reuse the router tile. Each block applies its router row to up to this many rows, so more rows take more blocks
// (--batch-invariant sends every row count here: a row's logits do not depend on the other rows).
constexpr int64_t kRouterGemvMaxRows = 8;

// The choice over the logits (RouterParams of backend.h).
struct RouterChoice {
  int32_t n_group = 1, topk_group = 1, top_k = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// Whether router_gemv and route_fused compute these shapes (hidden a multiple of 4 up to 16,384, and 16-byte aligned
// h and router); otherwise the caller uses a GEMM.
bool router_gemv_supported(const float* h, const float* router, int64_t hidden);

// logits [rows, experts] = h [rows, hidden] · router [experts, hidden]ᵀ, every row summed in the same order.
cudaError_t router_gemv(const float* h, const float* router, int64_t rows, int64_t hidden, int64_t experts,
                        float* logits, cudaStream_t stream);

// Group-limited top-k over router logits [rows, experts] (computed beforehand).
cudaError_t route_topk(const float* logits, const float* bias, int64_t rows, int32_t experts,
                       const RouterChoice& choice, int32_t* expert_ids, float* expert_weights, cudaStream_t stream);

// router_gemv then route_topk in one launch, for 1..kRouterGemvMaxRows rows: a block per expert writes its logits to
// `logits` [rows, experts] (scratch) and counts itself in `arrivals`; the last block to arrive routes every row and
// sets `arrivals` back to 0. The same logits and choices, bit for bit, as the two launches. `arrivals`: one device
// word, zero before the first launch, used by one stream at a time.
cudaError_t route_fused(const float* h, const float* router, const float* bias, int64_t rows, int64_t hidden,
                        int32_t experts, const RouterChoice& choice, float* logits, uint32_t* arrivals,
                        int32_t* expert_ids, float* expert_weights, cudaStream_t stream);

// One row (decode): residual += scale * rms(y, weight); out = rms(residual, next_weight); then route_fused over
// out: the residual add after attention, the MoE's input norm and the router in one launch
// (Backend::add_rms_norm_then_route).
// Weights of one dtype, BF16 or F16 (F32 weights would not fit two blocks an SM: the caller takes the two ops); rows of
// up to 8,192 values, a multiple of 4. `logits` [experts] scratch and `arrivals` as route_fused's.
bool add_rms_norm_then_route_supported(const float* residual, const float* y, const float* out, const float* router,
                                       DType weight_dtype, int64_t hidden, int32_t experts,
                                       const RouterChoice& choice);
cudaError_t add_rms_norm_then_route(float* residual, const float* y, const void* weight, const void* next_weight,
                                    DType weight_dtype, float eps, float scale, int64_t hidden, float* out,
                                    const float* router, const float* bias, int32_t experts, const RouterChoice& choice,
                                    float* logits, uint32_t* arrivals, int32_t* expert_ids, float* expert_weights,
                                    cudaStream_t stream);

}  // namespace beamline::cuda

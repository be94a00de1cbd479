#pragma once
// Host side of the one-token quantized MoE kernels (token_moe.cuh, staged_moe.cuh): the scratch the backend hands them.
#include <cstdint>

namespace beamline::cuda {

// Output rows per down block of the staged kernels: the combine's unit (one arrival counter each).
constexpr int64_t kTokenMoeCombineRows = 160;
constexpr int64_t token_moe_counters(int64_t hidden) {
  return (hidden + kTokenMoeCombineRows - 1) / kTokenMoeCombineRows;
}

// Scratch of one call with one token and top_k routed experts (moe_tokens: activated also for more tokens).
struct TokenMoeScratch {
  float* activated = nullptr;   // [top_k, I] (16-byte aligned): SwiGLU outputs
  float* partial = nullptr;     // [top_k, H]: each routed expert's down output before the combine (staged kernels)
  int32_t* counters = nullptr;  // [token_moe_counters(H)]: arrivals per combine unit, zeroed by the gate|up pass
};

}  // namespace beamline::cuda

#pragma once
// Host side of the one-token quantized MoE kernels (token_moe.cuh, staged_moe.cuh): the scratch the backend hands them.
#include <cstdint>

namespace beamline::cuda {

// Output rows per down block of the staged kernels: the combine's unit (one arrival counter each).
constexpr int64_t kTokenMoeCombineRows = 160;
constexpr int64_t token_moe_counters(int64_t hidden) {
  return (hidden + kTokenMoeCombineRows - 1) / kTokenMoeCombineRows;
}
// Tokens per launch pair of the staged kernels (grid z); callers cut more into calls of this many.
constexpr int64_t kTokenMoeMaxTokens = 64;

// Scratch of one call with `tokens` tokens and top_k routed experts each.
struct TokenMoeScratch {
  float* activated = nullptr;   // [tokens * top_k, I] (16-byte aligned): SwiGLU outputs
  float* partial = nullptr;     // [tokens * top_k, H]: each routed expert's down output before the combine (staged)
  int32_t* counters = nullptr;  // [tokens * token_moe_counters(H)]: arrivals per combine unit, zeroed by gate|up
};

}  // namespace beamline::cuda

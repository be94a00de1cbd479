#pragma once
// MoE LoRA (Backend::moe_lora) on the GPU: the routed experts with each token's adapters at their true ranks, as
// launches of their own beside the MoE kernels of moe/ (which are not touched: a step without adapters runs them as
// before). moe_lora.cu.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace beamline::cuda {

// One projection's LoraTable (backend.h) on the device: entries I64 [slots * experts, 3] = {a address, b address,
// rank}; null when no adapter adapts the projection.
struct LoraTableView {
  const int64_t* entries = nullptr;
  int64_t max_rank = 0;
};

struct MoeLoraArgs {
  const float* h = nullptr;               // [rows, H]
  const int32_t* ids = nullptr;           // [rows, top_k]
  const float* weights = nullptr;         // [rows, top_k]
  const int32_t* row_adapters = nullptr;  // [rows] slot of each token, -1: none
  int64_t rows = 0, hidden = 0, intermediate = 0;
  int32_t top_k = 0, experts = 0;
  const void* const* expert_weights = nullptr;  // [3, experts] device addresses of gate, up [I, H] and down [H, I]
  DType dtype = DType::BF16;                    // of the expert weights: F32, F16 or BF16
  LoraTableView gate, up, down;
};

// Scratch of one call, for A = rows * top_k assignments.
struct MoeLoraWorkspace {
  int32_t* grouped = nullptr;     // [A] (moe_group_slots)
  int32_t* tiles = nullptr;       // [max_tiles, 4]
  int64_t max_tiles = 0;          // moe_lora_max_tiles
  float* shrunk_gate = nullptr;   // [A, gate.max_rank] (unused when gate is null)
  float* shrunk_up = nullptr;     // [A, up.max_rank]
  float* shrunk_down = nullptr;   // [A, down.max_rank]
  float* activated = nullptr;     // [A, I]
  float* expert_out = nullptr;    // [A, H]
};
int64_t moe_lora_max_tiles(int64_t assignments, int32_t experts);

// out[t] = sum over j in order of weights[t, j] * y_j, y_j = down_e(silu(gate_e(h_t)) * up_e(h_t)) for e = ids[t, j],
// where each projection adds b_i (a_i x) of entry i = row_adapters[t] * experts + e of its table (the rank-r_i
// intermediate in FP32 first; none for slot -1 or rank 0): the cpu backend's arithmetic, routing weight after the
// down projection and its LoRA. Slots grouped by expert (moe_group_slots) so that each expert's weight row is read
// once per tile of 8 of its slots. F32 accumulation throughout. Expert ids outside [0, experts) make the token NaN.
cudaError_t moe_lora(const MoeLoraArgs& args, const MoeLoraWorkspace& workspace, float* out, cudaStream_t stream);

}  // namespace beamline::cuda

#pragma once
// MoE LoRA (Backend::moe_lora) on the GPU: the experts' LoRA as deltas that enter moe's own expert kernels through
// their hooks (moe/moe.h, ExpertDeltas), so the base GEMMs are the plain MoE op's and only the rank-r shrinks and
// expands are launches of their own. moe_lora.cu.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/moe/moe.h"

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
  const int32_t* row_adapters = nullptr;  // [rows] slot of each token, -1: none
  int64_t rows = 0, hidden = 0, intermediate = 0;
  int32_t top_k = 0, experts = 0;
  LoraTableView gate, up, down;
};

// Scratch of one call, for A = rows * top_k assignments.
struct MoeLoraWorkspace {
  int32_t* grouped = nullptr;    // [A] (moe_group_slots); null: the slots in their own order (one token)
  int32_t* tiles = nullptr;      // [max_tiles, 4], with grouped
  int64_t max_tiles = 0;         // moe_lora_max_tiles
  float* shrunk_gate = nullptr;  // [A, gate.max_rank] (unused when gate is null)
  float* shrunk_up = nullptr;    // [A, up.max_rank]
  float* shrunk_down = nullptr;  // [A, down.max_rank]
  float* gate_up = nullptr;      // [A, 2 I] (unused when gate and up are null)
  float* down = nullptr;         // [A, H] (unused when down is null)
};
int64_t moe_lora_max_tiles(int64_t assignments, int32_t experts);

// Launches what the MoE op with the experts' LoRA needs before its expert GEMMs, and sets `deltas` for them: for
// each slot s = t * top_k + j with an entry i = row_adapters[t] * experts + ids[t, j] of rank r_i > 0 (none for slot
// -1, rank 0 or no table), the gate and up deltas b_i (a_i h_t) into workspace.gate_up, and a compute_down that
// writes b_i (a_i x_s) of the down table for the SwiGLU output x_s into workspace.down (zeros for slots without an
// entry). The rank-r_i intermediates are F32 (the cpu backend's arithmetic, in another order). The slots are worked
// grouped by expert (when workspace.grouped is set), so the slots of one expert and adapter read its A and B from
// L2 after the first. Slots of an expert id outside [0, experts) get no delta (the MoE op makes their token NaN).
cudaError_t moe_lora_deltas(const MoeLoraArgs& args, const MoeLoraWorkspace& workspace, ExpertDeltas& deltas,
                            cudaStream_t stream);

}  // namespace beamline::cuda

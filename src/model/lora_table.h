#pragma once
// The adapters of one SwiGLU projection (a MoE layer's experts, or a dense MLP as one expert) at their true ranks
// (docs/lora.md): each slot holds its adapter's matrices back to back in one A and one B buffer sized to what that
// adapter has, and the LoraTable (backend.h) addresses entry slot * experts + e. An expert at r / top_k = 8 takes 8
// rows, not --max-lora-rank.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/lora_weights.h"

namespace beamline {

class LoraTableStore {
 public:
  LoraTableStore(Backend& backend, int32_t slots, int64_t experts, int64_t in, int64_t out);

  // Replaces `slot`'s adapters with modules[e] for expert e (null: expert e not adapted in this slot), each
  // [rank, in] / [out, rank] with the scale in B. What the slot held before is freed. Error naming the expert for a
  // module of other shape, a rank below 1 or values that do not fill it.
  void load(int32_t slot, std::span<const LoraModule* const> modules);
  const LoraTable& table() const { return table_; }
  // Bytes of A and B held by every slot (F32).
  int64_t bytes() const;

 private:
  Backend& backend_;
  int64_t experts_;
  std::vector<int64_t> entries_;       // host copy of table_.entries
  std::vector<Tensor> slot_a_, slot_b_;  // per slot: [sum of its ranks, in] and [sum of its ranks * out]
  LoraTable table_;
};

}  // namespace beamline

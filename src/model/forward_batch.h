#pragma once
// What one forward step computes: a flattened (varlen) batch of tokens from several sequences, with the
// paged-KV block tables that say where each sequence's keys and values live. The engine builds it; the
// model runs it on any backend. Never padded. Plain host data: the engine's scheduler builds it without seeing a
// device.
#include <cstdint>
#include <vector>

#include "kv/kv_cache_layout.h"

namespace beamline {

struct SequenceSlice {
  int32_t token_begin = 0;   // rows [token_begin, token_end) of ForwardBatch::tokens
  int32_t token_end = 0;
  int32_t context_begin = 0; // absolute position of the first new token = tokens already in the KV cache
  // block_tables[group][i] = pool block holding positions [i*block_size, (i+1)*block_size) (or kNullBlock);
  // covers at least context_begin + (token_end - token_begin) positions.
  std::vector<std::vector<int32_t>> block_tables;
  // The LoRA adapter slot its rows use (BeamModel::load_lora; docs/lora.md), -1 for none.
  int32_t lora_slot = -1;
};

// A token row whose id the host does not know yet (overlapped scheduling, --async-scheduling): the previous step
// sampled it on the device, as its sampled row `source` (the order of ModelStep::sample's rows); tokens[row] holds a
// placeholder. The runner keeps those samples on the device and hands them to the model (BeamModel::forward's
// token_source).
struct DeferredToken {
  int32_t row = 0;
  int32_t source = 0;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;             // all new tokens, sequence after sequence
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logit_rows;         // token rows whose logits are wanted (e.g. the last of each sequence)
  std::vector<DeferredToken> deferred_tokens;
  // Routing replay: some sequence wants the experts its tokens are routed to (ModelStep::routed_experts).
  bool capture_routed_experts = false;
};

}  // namespace beamline

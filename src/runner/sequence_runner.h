#pragma once
// One sequence fed through a BeamModel step by step with its own KV cache and block allocator: what the
// `logits` and `generate` commands and the model tests need (the serving engine batches many sequences
// with its own allocator instead).
#include <cstdint>
#include <span>
#include <vector>

#include "model/beam_model.h"
#include "runner/kv_cache.h"

namespace beamline {

class SequenceRunner {
 public:
  // A pool sized for up to max_len positions fed at most max_step tokens per step.
  SequenceRunner(BeamModel& model, int64_t max_len, int64_t max_step, DType kv_dtype = DType::F32);

  // Feeds `tokens` after the ones fed so far (one prefill or decode step) and returns, row-major, the
  // logits [n, vocab] of every new position when all_positions, else of the last one only ([1, vocab]); none on a
  // middle pipeline stage of a distributed model.
  std::vector<float> step(std::span<const int32_t> tokens, bool all_positions);

  // The LoRA adapter slot the sequence's rows use from the next step (BeamModel::load_lora), -1 for none.
  void set_lora_slot(int32_t slot) { lora_slot_ = slot; }

  int64_t length() const { return length_; }
  const KvCache& cache() const { return cache_; }
  int32_t blocks_in_use() const { return blocks_.blocks_in_use(); }

 private:
  BeamModel& model_;
  int64_t max_len_, max_step_;
  KvCache cache_;
  SingleSequenceBlocks blocks_;
  int64_t length_ = 0;
  int32_t lora_slot_ = -1;
};

}  // namespace beamline

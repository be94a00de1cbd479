#include "runner/sequence_runner.h"

#include "util/error.h"

namespace beamline {
namespace {
KvCacheLayout single_sequence_layout(const ModelConfig& config, int64_t max_len, int64_t max_step) {
  require(max_len > 0 && max_step > 0, "sequence: max_len {} and max_step {} must be positive", max_len, max_step);
  KvCacheLayout layout = make_kv_cache_layout(config, default_block_size(config), 0);
  layout.num_blocks = single_sequence_blocks(layout, config, max_len, max_step);
  return layout;
}
}  // namespace

SequenceRunner::SequenceRunner(BeamModel& model, int64_t max_len, int64_t max_step, DType kv_dtype)
    : model_(model),
      max_len_(max_len),
      max_step_(max_step),
      cache_(model.backend(), model.config(), single_sequence_layout(model.config(), max_len, max_step), kv_dtype),
      blocks_(cache_.layout(), model.config().sliding_window) {}

std::vector<float> SequenceRunner::step(std::span<const int32_t> tokens, bool all_positions) {
  const auto count = static_cast<int64_t>(tokens.size());
  require(count > 0, "sequence: a step needs at least one token");
  require(count <= max_step_, "sequence: a step of {} tokens exceeds the {} this runner was sized for", count,
          max_step_);
  require(length_ + count <= max_len_, "sequence: {} + {} tokens exceed the maximum length {}", length_, count,
          max_len_);
  ForwardBatch batch;
  batch.tokens.assign(tokens.begin(), tokens.end());
  SequenceSlice slice;
  slice.token_begin = 0;
  slice.token_end = static_cast<int32_t>(count);
  slice.context_begin = static_cast<int32_t>(length_);
  slice.block_tables = blocks_.prepare(length_, length_ + count);
  slice.lora_slot = lora_slot_;
  batch.sequences.push_back(std::move(slice));
  if (all_positions) {
    for (int32_t row = 0; row < static_cast<int32_t>(count); ++row) batch.logit_rows.push_back(row);
  } else {
    batch.logit_rows.push_back(static_cast<int32_t>(count - 1));
  }
  const Tensor logits = model_.forward(batch, cache_);
  length_ += count;
  if (!logits.defined()) return {};  // a middle pipeline stage of a distributed model
  return model_.backend().download_f32(logits);
}

}  // namespace beamline

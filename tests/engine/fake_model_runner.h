#pragma once
// A deterministic stand-in for the model that checks the engine's paging: it stores (token, position, group)
// in the pool blocks the batch's block tables name, and computes each logit row from what it reads back
// through those tables: every position for full-attention groups, the last `sliding_window` positions for
// sliding groups. A wrong, missing or reused block changes the logits or throws. The logits live on a CPU
// backend and go through the runners' StepSampler, so they are sampled as a real model's are.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/model_runner.h"
#include "runner/step_sampler.h"
#include "util/counter_random.h"

namespace beamline::testing {


// Groups: `full_groups` full-attention groups, then `sliding_groups` sliding ones, 2 layers each.
inline KvCacheLayout fake_layout(int32_t block_size, int32_t num_blocks, int32_t full_groups, int32_t sliding_groups) {
  KvCacheLayout layout;
  layout.block_size = block_size;
  layout.num_blocks = num_blocks;
  layout.slots_per_block = 2;
  for (int32_t g = 0; g < full_groups + sliding_groups; ++g) {
    layout.group_is_sliding.push_back(g >= full_groups);
    for (int32_t slot = 0; slot < 2; ++slot) {
      layout.layer_group.push_back(g);
      layout.layer_slot.push_back(slot);
    }
  }
  return layout;
}

class FakeModelRunner : public ModelRunner {
 public:
  FakeModelRunner(KvCacheLayout layout, int32_t sliding_window, int32_t vocab_size, int64_t max_positions = 4096)
      : layout_(std::move(layout)), window_(sliding_window), vocab_(vocab_size), max_positions_(max_positions),
        cells_(static_cast<std::size_t>(layout_.num_blocks) * layout_.block_size) {}

  int32_t vocab_size() const override { return vocab_; }
  const KvCacheLayout& kv_layout() const override { return layout_; }
  int32_t sliding_window() const override { return window_; }
  int64_t max_position_embeddings() const override { return max_positions_; }
  int64_t kv_bytes_per_block() const override { return int64_t{layout_.slots_per_block} * layout_.block_size * 64; }

  int64_t forward_calls = 0;
  int64_t max_batch_tokens = 0;
  int64_t deferred_steps = 0;  // steps with tokens read from the previous step's samples
  std::chrono::microseconds step_delay{0};  // makes steps slow enough for tests that race the engine thread
  float logit_scale = 1.0f;  // below 1 flattens every distribution (logits in [-4, 4] times this)

  std::unique_ptr<ModelStep> launch(const ForwardBatch& batch) override {
    count_verify_steps(batch);
    last_batch_ = batch;
    return sampler_.step(forward(batch), batch.logit_rows.size());
  }

  // Pretends to hold a drafter's context (the engine's commit and truncation calls) without proposing anything
  // itself: per sequence, where its committed run ends. A commit whose rows do not start where the run ends (after the
  // run was truncated to what was verified) counts in `context_gaps`: the next anchor would find no context.
  bool drafter_context = false;
  bool has_drafter() const override { return drafter_context; }
  void commit_draft_context(std::span<const StepVerified> sequences) override {
    for (const StepVerified& verified : sequences) {
      const SequenceSlice& slice = last_batch_.sequences.at(static_cast<std::size_t>(verified.batch_index));
      const auto found = context_end.find(verified.sequence_id);
      if (found != context_end.end() && found->second != slice.context_begin) ++context_gaps;
      context_end[verified.sequence_id] = verified.verified_length;
      ++context_commits;
    }
  }
  void truncate_draft_context(int64_t sequence_id, int64_t verified_length) override {
    int64_t& end = context_end.at(sequence_id);
    end = std::min(end, verified_length);
    ++context_truncations;
  }
  void forget_sequence(int64_t sequence_id) override { context_end.erase(sequence_id); }
  std::map<int64_t, int64_t> context_end;
  int64_t context_commits = 0, context_truncations = 0, context_gaps = 0;

  // Says it replays decode graphs (as BeamModelRunner on a GPU), for the engine's rules that depend on it.
  bool replays_graphs = false;
  bool replays_decode_graphs() const override { return replays_graphs; }
  // Steps with a verify sequence (several rows, every one a logit row), and those of them that also carried prompt
  // rows (rows without logits): on a runner with decode graphs those ran op by op.
  int64_t verify_steps = 0, verify_steps_with_prompt_rows = 0;

 private:
  struct Cell {
    int32_t token = -1, position = -1, group = -1;
  };

  void count_verify_steps(const ForwardBatch& batch) {
    std::vector<bool> logit(batch.tokens.size(), false);
    for (const int32_t row : batch.logit_rows) logit.at(static_cast<std::size_t>(row)) = true;
    bool verifies = false;
    for (const SequenceSlice& slice : batch.sequences)
      verifies = verifies || (slice.token_end - slice.token_begin > 1 &&
                              std::all_of(logit.begin() + slice.token_begin, logit.begin() + slice.token_end,
                                          [](bool row) { return row; }));
    if (!verifies) return;
    ++verify_steps;
    if (std::find(logit.begin(), logit.end(), false) != logit.end()) ++verify_steps_with_prompt_rows;
  }

  Tensor forward(const ForwardBatch& batch) {
    ++forward_calls;
    if (step_delay.count() > 0) std::this_thread::sleep_for(step_delay);
    max_batch_tokens = std::max<int64_t>(max_batch_tokens, static_cast<int64_t>(batch.tokens.size()));
    // --async-scheduling: rows whose ids the previous step sampled, read where a device would read them.
    std::vector<int32_t> tokens = batch.tokens;
    if (!batch.deferred_tokens.empty()) {
      ++deferred_steps;
      const std::vector<int32_t> source = backend_->download_i32(sampler_.deferred_source());
      for (const DeferredToken& deferred : batch.deferred_tokens) tokens.at(deferred.row) = source.at(deferred.source);
    }
    std::vector<int32_t> row_sequence(batch.tokens.size(), -1);
    for (std::size_t s = 0; s < batch.sequences.size(); ++s) {
      const SequenceSlice& slice = batch.sequences[s];
      if (static_cast<int32_t>(slice.block_tables.size()) != layout_.num_groups()) throw std::runtime_error("fake model: wrong number of block tables");
      for (int32_t row = slice.token_begin; row < slice.token_end; ++row) {
        row_sequence[row] = static_cast<int32_t>(s);
        const int32_t position = slice.context_begin + (row - slice.token_begin);
        for (int32_t g = 0; g < layout_.num_groups(); ++g) {
          cell(slice.block_tables[g], position) = Cell{tokens[row], position, g};
        }
      }
    }
    std::vector<float> logits;
    logits.reserve(batch.logit_rows.size() * vocab_);
    for (int32_t row : batch.logit_rows) {
      const SequenceSlice& slice = batch.sequences.at(row_sequence.at(row));
      const int32_t position = slice.context_begin + (row - slice.token_begin);
      uint64_t full = 0x1234, window = 0x5678;
      for (int32_t g = 0; g < layout_.num_groups(); ++g) {
        const bool sliding = layout_.group_is_sliding[g];
        const int32_t first = sliding ? std::max(0, position - window_ + 1) : 0;
        uint64_t h = 0;
        for (int32_t p = first; p <= position; ++p) {
          const Cell& value = cell(slice.block_tables[g], p);
          if (value.position != p || value.group != g) {
            throw std::runtime_error(fmt::format("fake model: group {} reads position {} and finds position {} of group {}",
                                                 g, p, value.position, value.group));
          }
          h = finalize64(h ^ (static_cast<uint64_t>(value.token) << 32 | static_cast<uint32_t>(p)));
        }
        (sliding ? window : full) ^= finalize64(h + static_cast<uint64_t>(g));
      }
      const uint64_t context = finalize64(full * 31 + window);
      for (int32_t v = 0; v < vocab_; ++v) {
        const uint64_t bits = finalize64(context ^ (static_cast<uint64_t>(v) * 0x9e3779b97f4a7c15ULL));
        logits.push_back((static_cast<float>(bits >> 40) / static_cast<float>(1 << 24) * 8.0f - 4.0f) * logit_scale);
      }
    }
    if (batch.logit_rows.empty()) return {};
    return backend_->upload_f32(logits, {static_cast<int64_t>(batch.logit_rows.size()), vocab_});
  }

  Cell& cell(const std::vector<int32_t>& table, int32_t position) {
    const auto index = static_cast<std::size_t>(position / layout_.block_size);
    if (index >= table.size()) throw std::runtime_error(fmt::format("fake model: block table too short for position {}", position));
    const int32_t block = table[index];
    if (block < 0 || block >= layout_.num_blocks) throw std::runtime_error(fmt::format("fake model: position {} maps to block {}", position, block));
    return cells_[static_cast<std::size_t>(block) * layout_.block_size + position % layout_.block_size];
  }

  ForwardBatch last_batch_;
  KvCacheLayout layout_;
  int32_t window_;
  int32_t vocab_;
  int64_t max_positions_;
  std::vector<Cell> cells_;
  std::unique_ptr<Backend> backend_ = make_cpu_backend();
  StepSampler sampler_{*backend_, vocab_};
};

}  // namespace beamline::testing

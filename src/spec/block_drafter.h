#pragma once
// The DFlash-style block drafter's forward pass (docs/model-format.md §6, exact math in DRAFTER_SEMANTICS.md): one
// pass over the anchor and B - 1 mask tokens of every drafting sequence proposes B - 1 tokens each, reading the
// target's hidden states of the committed context through per-sequence context features (spec/context_features.h).
// Written against the Backend op set, so the CPU and CUDA backends both run it.
//
// The attention of a draft layer (context keys within the window plus every key of the block): the block's K/V are
// written into the sequence's ring after its context, and one Backend::block_attention per layer serves every block
// row of every drafting sequence (rows block-row-major: row i of every sequence together). The same attention is B
// one-row paged_attention calls per layer, row i a query at the block's last position with a window of W_d + B - 1 - i
// keys, which reaches back exactly to the oldest context key row i may see (P + i - t < W_d) and forward over the
// whole block: BEAMLINE_DRAFTER_ATTENTION=rows runs those instead, to measure the op against them
// (bench/gpu_specblock.sh).
//
// On a backend with graphs the pass is recorded once per shape (drafting sequences, draft tokens and the attention
// plans of its B windows) and replayed after one upload of its index data: ~80 ops per pass that each cost the host
// more than the device at a small drafter's size (docs/speculative-decoding.md, "Cost of a drafted step").
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/drafter_checkpoint.h"
#include "model/beam_model.h"
#include "model/forward_batch.h"
#include "spec/context_features.h"
#include "spec/draft_proposal.h"

namespace beamline {

// Rows [first_row, first_row + count) of a target step, at positions first_position.., of `sequence`, all verified.
struct VerifiedRows {
  int64_t sequence = 0;
  int32_t first_row = 0;
  int64_t first_position = 0;
  int32_t count = 0;
};

// A draft asked for: the sequence's last token `token` (not yet through the target) at `position` P.
struct DraftAnchor {
  int64_t sequence = 0;
  int64_t position = 0;
  int32_t token = 0;
};

class BlockDrafter {
 public:
  // `target` must outlive the drafter (its embeddings, final norm and LM head are shared); the drafter tells it which
  // hidden states to capture. `max_sequences` sequences keep context features at once. With `record_graphs` (and a
  // backend that has them) passes replay recorded graphs; off, every pass runs op by op (--enforce-eager).
  BlockDrafter(DrafterCheckpoint checkpoint, BeamModel& target, int32_t max_sequences, bool record_graphs = false);

  // Graphs of the pass kept at once (the least recently used goes first).
  static constexpr std::size_t kMaxGraphs = 32;

  const DrafterConfig& config() const { return checkpoint_.config; }

  // The context features of the rows of the target's latest step that are verified; `captured`: that step's hidden
  // states (BeamModel::captured_hidden, or a recorded decode graph's), F32 [layers, rows >= the step's, hidden].
  void commit(std::span<const VerifiedRows> rows, const Tensor& captured);
  // Up to `num_tokens` (<= B - 1) draft tokens per anchor, in order, with the drafter's probability of each; empty
  // for a sequence whose context features do not cover its window yet (spec/context_features.h).
  std::vector<DraftProposal> propose(std::span<const DraftAnchor> anchors, int32_t num_tokens);

  // The pass itself: the block logits of rows 1..num_tokens of the anchors that draft (`drafting`, indices into the
  // anchors), F32 [num_tokens * drafting.size(), vocab] block-row-major (row (i - 1) * S + s is block row i of drafting
  // anchor s). An anchor at position 0 drafts with no context. A replayed pass's logits are its graph's buffer: read
  // them (in stream order) before the next pass or step.
  struct BlockLogits {
    std::vector<std::size_t> drafting;
    Tensor logits;
  };
  BlockLogits block_logits(std::span<const DraftAnchor> anchors, int32_t num_tokens);
  // The committed positions of `sequence` from `end` on were rejected drafts (ContextFeatureRing::truncate).
  void truncate(int64_t sequence, int64_t end) { ring_.truncate(sequence, end); }
  void forget(int64_t sequence) { ring_.forget(sequence); }

  // Passes that recorded a graph / replayed one, for logs and tests.
  int64_t recorded() const { return recorded_; }
  int64_t replayed() const { return replayed_; }

 private:
  struct Layer {
    Tensor input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
    LinearTensors q, k, v, o;
    SwigluTensors mlp;
  };
  // One upload for a pass's index data: each part appended, then views of the uploaded tensor.
  class PackedInts;
  // A pass's host-side description: its index data and the attention batches of its writes and queries.
  struct Pass;
  struct Graph {
    Tensor inputs;  // the index data the graph reads, refreshed before each replay
    Tensor logits;  // what it writes
    std::unique_ptr<OpGraph> graph;
    int64_t last_used = 0;
  };

  AttentionParams attention_params(int32_t layer, int32_t window) const;
  // With row_attention_, block row i attends as the block's last position over W_d + B - 1 - i keys (the class comment).
  int32_t attention_window(int32_t block_row) const;
  Tensor run(const Pass& pass);
  std::optional<std::string> graph_key(const Pass& pass) const;
  Tensor replay_or_record(Pass& pass, const std::string& key);

  DrafterCheckpoint checkpoint_;  // its archive keeps the CPU backend's borrowed weights mapped
  BeamModel& target_;
  Backend& backend_;
  float eps_, residual_scale_, target_eps_;
  LinearTensors fc_;
  Tensor hidden_norm_;
  std::vector<Layer> layers_;
  ContextFeatureRing ring_;
  PagedKvPool pool_;  // [max_sequences, layers, R, kv_heads, head_dim] F32
  bool record_graphs_;
  bool row_attention_ = false;  // BEAMLINE_DRAFTER_ATTENTION=rows: B paged_attention calls per layer
  std::map<std::string, Graph> graphs_;
  int64_t passes_ = 0, recorded_ = 0, replayed_ = 0;
};

}  // namespace beamline

#pragma once
// What the engine needs from a model: one batched step over the paged KV cache the runner owns, from token ids to
// sampled token ids. The runner owns the step's device work (the forward pass, its logits, sampling them and reading
// the tokens back); the engine sees plain data only. BeamModelRunner (runner/beam_model_runner.h) wires BeamModel in;
// tests use deterministic fakes.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/forward_batch.h"
#include "sampling/sampling.h"
#include "spec/draft_proposal.h"
#include "tensor/tensor_view.h"
#include "util/error.h"

namespace beamline {

// How one logit row of a step becomes a token.
struct RowSampling {
  // settings.logit_row is the row's index in ForwardBatch::logit_rows; the rest is how the runner samples it.
  SampleRow settings;
  // Set for a row that needs what the runner's sampler does not do (logit bias, penalties, masked tokens): the
  // runner hands it the row's raw logits on the host and takes its token instead, and `settings` only names the
  // row. Keeping the per-sample history these edits read (engine/sampler.h) with the engine is why it is a
  // function and not data. The runner may call the rows' functions concurrently: each must touch only its own row's
  // state.
  std::function<SampledToken(std::span<const float> raw_logits)> sample_on_host;
  // Structured outputs: the tokens this row may take, a bitmask (bit t % 32 of word t / 32, ceil(vocab_size / 32)
  // words); empty: every token. The runner sets the others' logits to -inf before either path samples the row, so
  // sample_on_host and the logprobs see the masked row (as vLLM's grammar bitmask does).
  std::vector<uint32_t> allowed_tokens;
};

// Routing replay: the experts each token row of a step was routed to, in every MoE layer.
struct RoutedExperts {
  int32_t num_moe_layers = 0, top_k = 0;
  // [rows, num_moe_layers, top_k]: row r's choices in MoE layer l, in order of selection, at (r * layers + l) * top_k.
  std::vector<int16_t> ids;
  std::size_t row_width() const { return static_cast<std::size_t>(num_moe_layers) * static_cast<std::size_t>(top_k); }
};

// A step whose forward pass the runner has enqueued and whose tokens the engine has not taken yet.
class ModelStep {
 public:
  virtual ~ModelStep() = default;
  // Chooses the token of each row (at most once per step). Rows sampled by the runner are only enqueued: their tokens
  // and requested logprobs come back with tokens(); host rows are sampled before this returns.
  virtual void sample(std::vector<RowSampling> rows) = 0;
  // Waits for the sampled tokens, one per row given to sample(), in that order. Once, after sample().
  virtual std::vector<SampledToken> tokens() = 0;
  // After tokens(): the experts of every token row of the batch, when it set ForwardBatch::capture_routed_experts and
  // the runner captures them (--enable-return-routed-experts); otherwise no ids.
  virtual RoutedExperts routed_experts() { return {}; }
  // After tokens(): the raw logits of the step's logit rows `rows` (indices into ForwardBatch::logit_rows) on the host,
  // row after row, for what the engine computes there (prompt_logprobs).
  virtual std::vector<float> raw_logits(std::span<const int32_t> rows) {
    (void)rows;
    fail("this model step cannot hand out its logits");
  }
};

// Block drafting (--speculative-config dflash, spec/block_drafter.h): how far a sequence of the last launched step is
// verified, and where a draft is asked for.
struct StepVerified {
  int64_t sequence_id = 0;
  int32_t batch_index = 0;      // its SequenceSlice in the last launched ForwardBatch
  int64_t verified_length = 0;  // its positions [0, verified_length) hold verified tokens (num_computed_tokens)
};
struct DraftRequest {
  int64_t sequence_id = 0;
  int64_t position = 0;  // P: the last token's position (the token has not been through the target yet)
  int32_t token = 0;     // that token
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int32_t vocab_size() const = 0;
  // The layout of the KV pool the runner allocated (num_blocks set): the engine's allocator hands out
  // exactly these blocks.
  virtual const KvCacheLayout& kv_layout() const = 0;
  virtual int32_t sliding_window() const = 0;      // of the layout's sliding groups; 0 when there are none
  virtual int64_t max_position_embeddings() const = 0;
  virtual int64_t kv_bytes_per_block() const = 0;  // all slots of one pool block, K and V

  // Enqueues the forward pass of `batch`: writes the K/V of every token and keeps the logits of batch.logit_rows for
  // the returned step to sample. batch.deferred_tokens read the tokens of the step launched just before this one,
  // which must have sampled all its rows on the runner already (--async-scheduling: at its launch); the host need not
  // have them yet.
  virtual std::unique_ptr<ModelStep> launch(const ForwardBatch& batch) = 0;
  // The engine has no step to launch until something arrives (new work, a resume), or it stops. A runner whose steps
  // are taken together with other engines' (data parallelism, runner/data_parallel_steps.h) then stops waiting for
  // this one's.
  virtual void idle() {}

  // Whether a decode step whose sequences all have one row (or all the same number) replays a recorded graph, so that
  // a step with drafts of different lengths costs the whole batch its op-by-op launches (runner/decode_graphs.h).
  virtual bool replays_decode_graphs() const { return false; }

  // A drafter model (dflash) that proposes drafts from the target's hidden states; the three functions below are
  // used only when this is true.
  virtual bool has_drafter() const { return false; }
  // The positions before a draft whose target hidden states the drafter reads (its sliding window); 0 without one.
  virtual int32_t drafter_window() const { return 0; }
  // Right after a step is launched (before the next one is): the sequences of that step, with how far each would be
  // verified if every row of it is (its draft rows included). The drafter writes the target's hidden states of those
  // positions; the host's work overlaps the step's forward pass on the device.
  virtual void commit_draft_context(std::span<const StepVerified> sequences) { (void)sequences; }
  // Once the step's drafts are settled: the sequence's positions from `verified_length` on were rejected drafts, which
  // the drafter must not read as context (the next commit writes over them).
  virtual void truncate_draft_context(int64_t sequence_id, int64_t verified_length) {
    (void)sequence_id;
    (void)verified_length;
  }
  // Up to `num_tokens` draft tokens per request (none where the drafter has too little context yet).
  virtual std::vector<DraftProposal> propose_drafts(std::span<const DraftRequest> requests, int32_t num_tokens) {
    (void)num_tokens;
    return std::vector<DraftProposal>(requests.size());
  }
  // The sequence has ended: its drafting state goes.
  virtual void forget_sequence(int64_t sequence_id) { (void)sequence_id; }

  // /update_weights_from_disk: replaces the weights with the safetensors of `dir` (the same model, every tensor),
  // called between steps with none in flight. Everything is checked and loaded before the old weights are let go, so
  // a failure (Error naming the file and tensor) leaves the served weights as they were.
  virtual void load_weights_from_disk(const std::filesystem::path& dir) {
    fail("{}: this model runner cannot load new weights", dir.string());
  }

  // LoRA (--enable-lora, docs/lora.md), between steps with none in flight: reads the PEFT adapter in `dir`, checks it
  // against the model (Error naming the file and key or tensor) and puts it in `slot` (0 .. --max-loras - 1), which
  // the rows of sequences with SequenceSlice::lora_slot == slot use from the next step. After a failure the slot is
  // not used until a load into it succeeds.
  virtual void load_lora_adapter(int32_t slot, const std::filesystem::path& dir) {
    (void)slot;
    fail("{}: this model runner does not serve LoRA adapters", dir.string());
  }
  // The slot's adapter is no longer needed (no sequence uses it).
  virtual void unload_lora_adapter(int32_t slot) { (void)slot; }
  // vLLM's sleep mode (/sleep, docs/rl.md), between steps: gives the device memory back (the weights, the KV pool and
  // everything else the runner holds on the device); the KV cache's contents are lost, so the engine must recompute
  // every sequence afterwards. Level 1 keeps the weights on the host, level 2 expects new ones (an update while
  // asleep only replaces the host copy); either way wake_up() builds the model again from the host copy. Returns false,
  // changing nothing, where the runner keeps its memory (it logs why).
  virtual bool sleep(int32_t level) {
    (void)level;
    return false;
  }
  // After sleep() returned true: the device state again (an Error, still asleep, when it cannot be made).
  virtual void wake_up() {}
  // /update_weights_from_distributed: replaces the named tensors (checkpoint names, host bytes received from a
  // trainer) and keeps the others, under the same rules: between steps, everything checked and built before the old
  // weights go, an Error naming the tensor otherwise.
  virtual void update_weights(std::span<const HostTensor> tensors) {
    (void)tensors;
    fail("this model runner cannot take new weights");
  }
};

}  // namespace beamline

#pragma once
// ModelRunner over BeamModel: loads a checkpoint on a backend, sizes the paged KV pool from the engine's
// memory flags (once, at start-up) and runs batched steps through it: the forward pass (a recorded decode graph where
// one fits) and sampling on the same backend (runner/step_sampler.h).
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "model/beam_model.h"
#include "model/lora_weights.h"
#include "model/weights.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_config.h"
#include "parallel/parallel_groups.h"
#include "runner/data_parallel_steps.h"
#include "runner/decode_graphs.h"
#include "runner/kv_cache.h"
#include "runner/step_message.h"
#include "runner/step_sampler.h"
#include "spec/block_drafter.h"

namespace beamline {

class BeamModelRunner : public ModelRunner {
 public:
  // `device` is "cpu" or "cuda". The KV budget is --kv-cache-memory, or --gpu-memory-utilization of the
  // device (on the CPU backend: of kCpuKvCacheDefaultBytes); the pool gets as many blocks as fit.
  // `weights` come from a checkpoint or are random (dummy_weights, --load-format dummy). The compute and KV
  // dtypes are the config's --dtype and --kv-cache-dtype.
  BeamModelRunner(const BeamWeights& weights, std::string_view device, const EngineConfig& config);
  // One rank of a distributed model (docs/parallel.md): loads this rank's shard of `weights` on the GPU of its local
  // rank, sizes the KV pool to the smallest of all ranks', and runs the steps collectively. Rank 0 is the ModelRunner
  // the engine drives: launch() broadcasts each step's batch first. Every other rank calls follow(). With
  // --data-parallel-size above 1, rank 0 drives one engine per replica instead, each through launch_replica()
  // (runner/data_parallel_runner.h), and samples every replica's logits.
  BeamModelRunner(const BeamWeights& weights, std::string_view device, const EngineConfig& config, MpiWorld& world,
                  const ParallelConfig& parallel);
  ~BeamModelRunner() override;  // rank 0 of a distributed run tells the others to stop

  // Ranks other than 0: runs the steps that rank 0 broadcasts until it stops, and takes the new weights it sends
  // (load_weights_from_disk, update_weights). Throws Error when a step fails.
  void follow();
  // Rank 0: called (on the engine thread) with the cause when a distributed step fails. After that the ranks are out
  // of step, every later launch fails at once, and the caller should stop.
  void on_distributed_failure(std::function<void(const std::string&)> handler) { failure_handler_ = std::move(handler); }

  // Rank 0 of a data-parallel run: the data-parallel replicas, each served by an engine of its own.
  int32_t data_parallel_size() const { return groups_ == nullptr ? 1 : groups_->config.data; }
  // launch() for replica `replica`'s engine (any engine thread): the step runs together with the other replicas'
  // (runner/data_parallel_steps.h), and its logits are sampled here.
  std::unique_ptr<ModelStep> launch_replica(int32_t replica, const ForwardBatch& batch);
  // Replica `replica`'s engine waits for work: the other replicas' steps stop waiting for its batch.
  void replica_idle(int32_t replica);

  // From the whole model's config and the pool's layout, which stay while asleep.
  int32_t vocab_size() const override { return static_cast<int32_t>(weights_.config.vocab_size); }
  const KvCacheLayout& kv_layout() const override { return kv_layout_; }
  int32_t sliding_window() const override { return static_cast<int32_t>(weights_.config.sliding_window); }
  int64_t max_position_embeddings() const override { return weights_.config.max_position_embeddings; }
  int64_t kv_bytes_per_block() const override { return bytes_per_block_; }
  std::unique_ptr<ModelStep> launch(const ForwardBatch& batch) override;
  void load_weights_from_disk(const std::filesystem::path& dir) override;
  void load_lora_adapter(int32_t slot, const std::filesystem::path& dir) override;
  void unload_lora_adapter(int32_t slot) override;
  void update_weights(std::span<const HostTensor> tensors) override;
  // One process without a drafter: drops the backend itself (its caching allocator, weight arena, handles and
  // streams), with the model, KV pool, graphs and samplers on it, so that the device keeps only the CUDA context.
  // A distributed model (its communicators are made over the backend) or one with a drafter keeps its memory.
  bool sleep(int32_t level) override;
  void wake_up() override;
  bool replays_decode_graphs() const override { return graphs_ != nullptr; }
  bool has_drafter() const override { return drafter_ != nullptr; }
  int32_t drafter_window() const override {
    return drafter_ ? static_cast<int32_t>(drafter_->config().sliding_window) : 0;
  }
  void commit_draft_context(std::span<const StepVerified> sequences) override;
  void truncate_draft_context(int64_t sequence_id, int64_t verified_length) override;
  std::vector<DraftProposal> propose_drafts(std::span<const DraftRequest> requests, int32_t num_tokens) override;
  void forget_sequence(int64_t sequence_id) override;

  const ModelConfig& model_config() const { return model_->config(); }

 private:
  // The logits of batch.logit_rows (undefined when there are none); `token_source` feeds batch.deferred_tokens. With
  // batch.capture_routed_experts (and --enable-return-routed-experts) `routed_experts` gets the step's expert ids
  // (DecodeGraphs::forward's).
  Tensor forward(const ForwardBatch& batch, const Tensor& token_source, Tensor& routed_experts);

  // The model, its KV pool, graphs and sampler, once the backend (and, distributed, the groups) exist.
  void load(const BeamWeights& weights, const EngineConfig& config);
  // New weights for the served model (from disk or a trainer; `source` names them in messages): built beside the old
  // model, which serves on if that throws; then the old model goes and the decode graphs are recorded again.
  void replace_weights(const BeamWeights& weights, const std::string& source);
  // Refuses new weights where replace_weights cannot build them (under a drafter).
  void require_replaceable_weights(const std::string& source) const;
  // Rank 0 with data parallelism: backend_mutex_, so that a weight update goes between two combined steps on the step
  // channel (EngineClient::run_on_model has every engine between steps then); else nothing to lock.
  std::unique_lock<std::mutex> lock_steps();
  // Whether the forward pass of `batch` captures its routing (--enable-return-routed-experts and the batch asks).
  bool captures_routed_experts(const ForwardBatch& batch) const {
    return capture_routed_experts_ && batch.capture_routed_experts;
  }
  // The model of `weights` (the whole model's; sharded here for this rank), with the served LoRA adapters.
  std::unique_ptr<BeamModel> build_model(const BeamWeights& weights);
  // Puts `model` (built from `weights`) in the old one's place, keeping the KV scales, and records the graphs again.
  void install_model(std::unique_ptr<BeamModel> model, BeamWeights weights, const std::string& source);
  // Distributed, every rank: builds the model of make() beside the old one; then either every rank installs its new
  // model or, when some rank failed (make() or the build threw), none does and every rank throws an Error naming that
  // rank and its cause (rank 0's caller gets it; the others log it and follow on).
  void replace_weights_everywhere(const std::function<BeamWeights()>& make, const std::string& source);
  // A rank other than 0: the weight update rank 0 ordered (the directory, or the tensors' bytes that follow the order:
  // those this rank's shard computes with are kept).
  void follow_weight_update(const WeightUpdateOrder& order);
  // Rank 0's `nbytes` bytes at `data` to every rank, in broadcasts of at most 1 GiB; the other ranks get them back
  // (rank 0 an empty vector).
  std::vector<std::byte> broadcast_weight_bytes(const std::byte* data, std::size_t nbytes);
  // Runs collectives: a failure leaves the ranks out of step (record_failure), and is rethrown.
  void collective(const std::function<void()>& run);
  // Rank 0 of a distributed run: broadcasts the step (its deferred tokens filled in from the device) and runs it;
  // `routed_experts` as forward()'s.
  Tensor launch_distributed(const ForwardBatch& batch, Tensor& routed_experts);
  // `batch` as the other ranks receive it: its deferred tokens read from `sampler`'s last step; validated. Refuses
  // after a failure.
  ForwardBatch plan_batch(const ForwardBatch& batch, StepSampler& sampler);
  // Rank 0, data parallelism: broadcasts `plan` and runs it; every replica's logits and routed experts (the others'
  // received from their first rank).
  std::vector<ReplicaStepOutput> run_data_parallel_step(const ReplicaBatches& plan);
  // Every rank: its replica's part of `plan` (its batch, or a dummy step when expert parallelism needs one); the
  // logits and routed experts forward() gives.
  Tensor run_plan(const ReplicaBatches& plan, Tensor& routed_experts);
  // After a failure of a collective step: the ranks are out of step from here on.
  void record_failure(const std::string& cause);

  std::unique_ptr<Backend> backend_;        // null while asleep
  std::string device_;
  EngineConfig config_;                     // what load() was given, to make the device state again after sleep
  bool asleep_ = false;
  std::unique_ptr<ParallelGroups> groups_;  // null on one process
  std::function<void(const std::string&)> failure_handler_;
  std::string failure_;                     // the first distributed failure, after which launch refuses
  // Rank 0 with data parallelism: the replicas' combined steps, and the lock that keeps the engine threads' use of
  // the backend (steps, sampling, failure_) to one at a time.
  std::unique_ptr<DataParallelSteps> data_parallel_;
  std::mutex backend_mutex_;
  std::unique_ptr<BeamModel> model_;
  // What model_ was built from: the whole model's weights (not this rank's shard), which a weight update starts from.
  // A rank of a distributed model applies only the tensors its shard computes with: the others may be older here.
  BeamWeights weights_;
  std::unique_ptr<KvCache> cache_;
  KvCacheLayout kv_layout_;  // cache_'s
  DType kv_dtype_ = DType::F32;
  std::unique_ptr<DecodeGraphs> graphs_;  // null with --enforce-eager or a backend without graphs
  int32_t graph_max_num_seqs_ = 0;        // what graphs_ was recorded for, to record them again for new weights
  // Drops the recorded graphs and starts new ones (none when graph_max_num_seqs_ is 0): after what they read changed.
  void record_graphs_afresh();
  bool capture_routed_experts_ = false;   // --enable-return-routed-experts
  // One per data-parallel replica on rank 0 (each engine's deferred tokens are its own), else one.
  std::vector<std::unique_ptr<StepSampler>> samplers_;
  int64_t bytes_per_block_ = 0;
  std::unique_ptr<BlockDrafter> drafter_;  // --speculative-config dflash
  // The rows of the last forward step, per sequence: which of them the drafter may keep (commit_draft_context).
  struct StepRows {
    int32_t first_row = 0, count = 0;
    int64_t first_position = 0;
  };
  std::vector<StepRows> last_step_rows_;
  Tensor last_captured_;  // the hidden states of the last step for the drafter (BeamModel::captured_hidden)
  // --enable-lora: the adapters in the slots, kept on the host to load them again into new weights.
  int32_t max_loras_ = 0;
  int64_t max_lora_rank_ = 0;
  std::map<int32_t, LoraWeights> lora_adapters_;
};

}  // namespace beamline

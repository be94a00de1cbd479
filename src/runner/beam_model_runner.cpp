#include "runner/beam_model_runner.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <set>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/drafter_checkpoint.h"
#include "checkpoint/lora_adapter.h"
#include "checkpoint/shard_weights.h"
#include "runner/routed_experts_step.h"
#include "runner/step_message.h"
#include "util/error.h"

namespace beamline {

BeamModelRunner::BeamModelRunner(const BeamWeights& weights, std::string_view device, const EngineConfig& config)
    : backend_(create_backend(device)), device_(device) {
  load(weights, config);
}

BeamModelRunner::BeamModelRunner(const BeamWeights& weights, std::string_view device, const EngineConfig& config,
                                 MpiWorld& world, const ParallelConfig& parallel) {
  if (device != "cpu") world.use_local_gpu();
  backend_ = create_backend(device);
  device_ = device;
  groups_ = make_parallel_groups(world, parallel, *backend_);
  load(weights, config);
  if (groups_->world_rank == 0 && parallel.data > 1)
    data_parallel_ = std::make_unique<DataParallelSteps>(
        parallel.data, [this](const ReplicaBatches& plan) { return run_data_parallel_step(plan); });
}

BeamModelRunner::~BeamModelRunner() {
  // How often a step ran op by op to record a graph against how often one replayed (each recording also captures and
  // instantiates: bench/dflash_throughput.py reports these lines).
  if (graphs_) spdlog::info("decode graphs: {} recorded, {} replayed", graphs_->recorded(), graphs_->replayed());
  if (drafter_ && (drafter_->recorded() > 0 || drafter_->replayed() > 0))
    spdlog::info("drafter passes: {} recorded, {} replayed", drafter_->recorded(), drafter_->replayed());
  if (groups_ == nullptr || groups_->world_rank != 0 || !failure_.empty()) return;
  try {
    std::vector<std::byte> stop = encode_step_message(nullptr);
    groups_->world->broadcast_bytes(stop, 0);
  } catch (const std::exception& error) {
    spdlog::error("telling the other ranks to stop: {}", error.what());
  }
}

void BeamModelRunner::load(const BeamWeights& weights, const EngineConfig& config) {
  config.validate();
  config_ = config;
  backend_->set_compute_dtype(parse_compute_dtype(config.dtype, backend_->device()));
  const DType kv_dtype = parse_kv_cache_dtype(config.kv_cache_dtype, backend_->compute_dtype());
  kv_dtype_ = kv_dtype;
  weights_ = weights;
  model_ = build_model(weights);
  if (config.calculate_kv_scales) model_->calculate_kv_scales();
  const ModelConfig& model_config = model_->config();
  // Each op then reduces every row in one fixed order whatever the batch (docs/rl.md, docs/cuda-backend.md).
  require(backend_->set_batch_invariant(config.batch_invariant),
          "--batch-invariant is not implemented on the {} backend; leave the flag (and VLLM_BATCH_INVARIANT) off",
          backend_->name());
  if (config.batch_invariant) spdlog::info("batch-invariant mode: a row's results do not depend on its batch");
  if (config.enable_return_routed_experts) {
    require(model_->num_moe_layers() > 0, "--enable-return-routed-experts: the model has no MoE layer");
    require(model_config.n_routed_experts <= INT16_MAX,
            "--enable-return-routed-experts: {} experts do not fit the int16 ids it returns", model_config.n_routed_experts);
    capture_routed_experts_ = true;
  }
  if (config.speculative.method == SpeculativeMethod::DFlash) {
    require(groups_ == nullptr, "--speculative-config: the dflash drafter runs with the whole target on one process");
    // Checked in full first, so that a drafter that does not fit is named as such.
    DrafterCheckpoint checkpoint =
        load_drafter_checkpoint(config.speculative.model, model_config, config.speculative.num_speculative_tokens);
    // Room for the running sequences and as many again that wait (preempted) with their context kept.
    drafter_ = std::make_unique<BlockDrafter>(std::move(checkpoint), *model_, 2 * config.max_num_seqs,
                                              !config.enforce_eager);
    const DrafterConfig& drafter = drafter_->config();
    spdlog::info("dflash drafter {}: {} layers reading target layers [{}], blocks of {}, window {}",
                 config.speculative.model, drafter.num_hidden_layers, fmt::join(drafter.target_layer_ids, ", "),
                 drafter.block_size, drafter.sliding_window);
  }
  if (config.enable_lora) {
    model_->enable_lora(config.max_loras, config.max_lora_rank);
    max_loras_ = config.max_loras;
    max_lora_rank_ = config.max_lora_rank;
    spdlog::info("LoRA: {} adapter slots of rank up to {}; steps run op by op (no recorded decode graphs)",
                 max_loras_, max_lora_rank_);
  }
  const int32_t block_size = config.block_size > 0 ? config.block_size : default_block_size(model_config);

  // The size of one block, measured on a one-block pool rather than restating the storage layout here.
  bytes_per_block_ = static_cast<int64_t>(
      KvCache(*backend_, model_config, make_kv_cache_layout(model_config, block_size, 1), kv_dtype).bytes());
  int64_t budget = 0;
  if (backend_->device() == Device::Cpu) {
    budget = kv_cache_budget_bytes(config, kCpuKvCacheDefaultBytes, 0);
  } else {
    const std::optional<Backend::MemoryInfo> memory = backend_->memory_info();
    require(config.kv_cache_memory_bytes > 0 || memory.has_value(),
            "--kv-cache-memory is needed on the {} backend (it does not report its memory)", backend_->name());
    // What the weights and the backend hold now, plus headroom for a step's activations and GEMM workspaces.
    const int64_t used = memory ? memory->used_bytes + kDeviceActivationHeadroomBytes : 0;
    budget = kv_cache_budget_bytes(config, memory ? memory->total_bytes : 0, used);
  }
  int64_t num_blocks = budget / bytes_per_block_;
  // Rank 0 schedules blocks that every rank must have.
  if (groups_ != nullptr) num_blocks = groups_->world->all_reduce_min(num_blocks);
  require(num_blocks >= 1 && num_blocks <= INT32_MAX,
          "a KV budget of {} bytes gives {} blocks of {} bytes; set --kv-cache-memory or --gpu-memory-utilization",
          budget, num_blocks, bytes_per_block_);
  cache_ = std::make_unique<KvCache>(*backend_, model_config,
                                     make_kv_cache_layout(model_config, block_size, static_cast<int32_t>(num_blocks)),
                                     kv_dtype);
  kv_layout_ = cache_->layout();
  spdlog::info("KV budget {:.1f} MiB: {} blocks of {} tokens x {} layer slots ({} bytes each, {}) on {}; compute {}",
               static_cast<double>(budget) / (1 << 20), num_blocks, block_size, cache_->layout().slots_per_block,
               bytes_per_block_, dtype_name(kv_dtype), backend_->name(),
               backend_->compute_dtype() == ComputeDType::Float32 ? "float32" : "bfloat16");
  // Collectives are not recorded into graphs (yet): a distributed model runs op by op.
  // With a drafter the graphs also write the hidden states it reads; its steps with drafts (several rows per
  // sequence) run op by op, its plain decode steps (adaptive verification's choice when drafts do not pay) replay.
  // LoRA steps read each row's adapter slot from the step's inputs, so one graph serves any mix of adapters.
  if (backend_->supports_graphs() && !config.enforce_eager && groups_ == nullptr) {
    graph_max_num_seqs_ = config.max_num_seqs;
    record_graphs_afresh();
    spdlog::info("decode steps of up to {} sequences replay recorded graphs (--enforce-eager to run them op by op)",
                 std::min(config.max_num_seqs, DecodeGraphs::kMaxBucket));
  }
  const bool samples_for_replicas = groups_ != nullptr && groups_->world_rank == 0;
  const int32_t replicas = samples_for_replicas ? groups_->config.data : 1;
  for (int32_t r = 0; r < replicas; ++r) samplers_.push_back(std::make_unique<StepSampler>(*backend_, vocab_size()));
}

void BeamModelRunner::load_weights_from_disk(const std::filesystem::path& dir) {
  const std::string source = dir.string();
  require_replaceable_weights(source);
  std::unique_lock lock = lock_steps();
  // Checked here in full before any other rank hears of it.
  const BeamWeights weights = load_weight_update(dir, weights_.config);
  if (groups_ == nullptr) return replace_weights(weights, source);
  collective([&] {
    std::vector<std::byte> order = encode_weight_update_message({source, {}});
    groups_->world->broadcast_bytes(order, 0);
  });
  replace_weights_everywhere([&] { return weights; }, source);
}

void BeamModelRunner::update_weights(std::span<const HostTensor> tensors) {
  const std::string source = fmt::format("{} received tensor(s)", tensors.size());
  require_replaceable_weights(source);
  std::unique_lock lock = lock_steps();
  if (groups_ == nullptr) return replace_weights(with_received_tensors(weights_, tensors), source);
  // Every tensor is checked here before any other rank hears of it; this rank keeps those its shard computes with.
  const std::set<std::string, std::less<>> used = model_->loaded_tensor_names();
  const BeamWeights weights =
      with_received_tensors(weights_, tensors, [&](std::string_view name) { return used.contains(name); });
  WeightUpdateOrder order;
  for (const HostTensor& tensor : tensors)
    order.tensors.push_back(TensorView{tensor.view.name, tensor.view.dtype, tensor.view.shape, nullptr, tensor.view.nbytes});
  collective([&] {
    std::vector<std::byte> message = encode_weight_update_message(order);
    groups_->world->broadcast_bytes(message, 0);
    for (const HostTensor& tensor : tensors) broadcast_weight_bytes(tensor.view.data, tensor.view.nbytes);
  });
  replace_weights_everywhere([&] { return weights; }, source);
}

void BeamModelRunner::follow_weight_update(const WeightUpdateOrder& order) {
  if (!order.directory.empty())
    return replace_weights_everywhere([&] { return load_weight_update(order.directory, weights_.config); },
                                      order.directory);
  const std::set<std::string, std::less<>> used = model_->loaded_tensor_names();
  std::vector<HostTensor> kept;
  collective([&] {
    for (const TensorView& header : order.tensors) {
      auto bytes = std::make_shared<std::vector<std::byte>>(broadcast_weight_bytes(nullptr, header.nbytes));
      if (!used.contains(header.name)) continue;
      TensorView view = header;
      view.data = bytes->data();
      kept.push_back({std::move(view), std::move(bytes)});
    }
  });
  replace_weights_everywhere([&] { return with_received_tensors(weights_, kept); },
                             fmt::format("{} received tensor(s)", order.tensors.size()));
}

std::vector<std::byte> BeamModelRunner::broadcast_weight_bytes(const std::byte* data, std::size_t nbytes) {
  constexpr std::size_t kChunkBytes = std::size_t{1} << 30;  // MPI counts are int
  const bool root = groups_->world_rank == 0;
  std::vector<std::byte> all(root ? 0 : nbytes), chunk;
  for (std::size_t at = 0; at < nbytes; at += kChunkBytes) {
    const std::size_t size = std::min(kChunkBytes, nbytes - at);
    if (root) chunk.assign(data + at, data + at + size);
    groups_->world->broadcast_bytes(chunk, 0);
    require(chunk.size() == size, "weight update: {} bytes broadcast where {} were due", chunk.size(), size);
    if (!root) std::memcpy(all.data() + at, chunk.data(), size);
  }
  return all;
}

void BeamModelRunner::collective(const std::function<void()>& run) {
  try {
    run();
  } catch (const std::exception& error) {
    record_failure(error.what());
    throw;
  }
}

void BeamModelRunner::replace_weights_everywhere(const std::function<BeamWeights()>& make, const std::string& source) {
  BeamWeights weights;
  std::unique_ptr<BeamModel> model;
  std::string cause;
  try {
    weights = make();
    model = build_model(weights);
  } catch (const std::exception& error) {
    cause = error.what();
  }
  int64_t failed = -1;
  collective([&] {
    failed = groups_->world->all_reduce_max(cause.empty() ? -1 : groups_->world_rank);
    if (failed < 0) return;
    std::vector<std::byte> bytes(cause.size());
    std::memcpy(bytes.data(), cause.data(), cause.size());
    groups_->world->broadcast_bytes(bytes, static_cast<int32_t>(failed));
    cause.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  });
  require(failed < 0, "{}: rank {} could not take the new weights, so no rank did (all serve the old ones): {}", source,
          failed, cause);
  install_model(std::move(model), std::move(weights), source);
}

std::unique_lock<std::mutex> BeamModelRunner::lock_steps() {
  return data_parallel_ != nullptr ? std::unique_lock(backend_mutex_) : std::unique_lock<std::mutex>();
}

void BeamModelRunner::require_replaceable_weights(const std::string& source) const {
  require(drafter_ == nullptr, "{}: loading new weights under a dflash drafter is not implemented (its context features "
          "come from the served weights)", source);
}

std::unique_ptr<BeamModel> BeamModelRunner::build_model(const BeamWeights& weights) {
  std::unique_ptr<BeamModel> model;
  if (groups_ == nullptr) {
    model = std::make_unique<BeamModel>(weights, *backend_);
  } else {
    const ModelShard shard = model_shard(weights.config, groups_->config, groups_->at);
    model = std::make_unique<BeamModel>(shard_weights(weights, shard), *backend_, shard, groups_.get());
  }
  if (max_loras_ > 0) {  // the adapters served stay: they are loaded into new weights too
    model->enable_lora(max_loras_, max_lora_rank_);
    for (const auto& [slot, adapter] : lora_adapters_) model->load_lora(slot, adapter);
  }
  return model;
}

void BeamModelRunner::replace_weights(const BeamWeights& weights, const std::string& source) {
  if (asleep_) {  // checked already; built by wake_up()
    weights_ = weights;
    spdlog::info("new weights from {} kept on the host until /wake_up", source);
    return;
  }
  // The new model is built beside the old one, which serves on if this throws (e.g. out of device memory).
  install_model(build_model(weights), weights, source);
}

bool BeamModelRunner::sleep(int32_t level) {
  if (asleep_) return true;
  if (groups_ != nullptr || drafter_ != nullptr) {
    spdlog::warn("sleep (level {}): device memory is kept: {} (docs/rl.md)", level,
                 groups_ != nullptr ? "a distributed model's communicators are made over its backend"
                                    : "the dflash drafter's state lives on the device");
    return false;
  }
  backend_->synchronize();
  // Everything made on the backend goes before it.
  graphs_.reset();
  samplers_.clear();
  last_captured_ = Tensor();
  cache_.reset();
  model_.reset();
  backend_.reset();
  asleep_ = true;
  spdlog::info("sleeping (level {}): the model, KV pool and backend are released; the weights stay on the host", level);
  return true;
}

void BeamModelRunner::wake_up() {
  if (!asleep_) return;
  std::unique_ptr<Backend> backend = create_backend(device_);
  backend->set_compute_dtype(parse_compute_dtype(config_.dtype, backend->device()));
  require(backend->set_batch_invariant(config_.batch_invariant), "wake_up: --batch-invariant on the {} backend",
          backend->name());
  backend_ = std::move(backend);
  try {
    model_ = build_model(weights_);
    // The pool starts empty: scales calculated by the first step are calculated again.
    if (config_.calculate_kv_scales) model_->calculate_kv_scales();
    cache_ = std::make_unique<KvCache>(*backend_, model_->config(), kv_layout_, kv_dtype_);
    record_graphs_afresh();
    samplers_.push_back(std::make_unique<StepSampler>(*backend_, vocab_size()));
  } catch (...) {
    samplers_.clear();
    graphs_.reset();
    cache_.reset();
    model_.reset();
    backend_.reset();
    throw;
  }
  asleep_ = false;
  spdlog::info("awake: model, KV pool ({} blocks) and graphs made again", kv_layout_.num_blocks);
}

void BeamModelRunner::install_model(std::unique_ptr<BeamModel> model, BeamWeights weights, const std::string& source) {
  // The cache holds codes written with the served scales (or the first step is still to calculate them): they stay.
  model->inherit_kv_scales(*model_);
  backend_->synchronize();
  // Recorded decode graphs read the old weights' buffers: they go first, and are recorded again over the new ones.
  graphs_.reset();
  model_ = std::move(model);
  weights_ = std::move(weights);
  record_graphs_afresh();
  spdlog::info("loaded new weights from {}", source);
}

void BeamModelRunner::load_lora_adapter(int32_t slot, const std::filesystem::path& dir) {
  require(max_loras_ > 0, "{}: LoRA adapters need --enable-lora", dir.string());
  lora_adapters_.erase(slot);
  LoraWeights adapter = load_peft_adapter(dir, weights_.config, max_lora_rank_);
  if (!asleep_) {
    model_->load_lora(slot, adapter);
    // The graphs hold the adapters' buffers and ranks as they were when recorded.
    record_graphs_afresh();
    spdlog::info("LoRA: {} in slot {}; the loaded adapters hold {:.1f} MiB on the backend", dir.string(), slot,
                 static_cast<double>(model_->lora_bytes()) / (1 << 20));
  }  // else wake_up() loads it with the model
  lora_adapters_.emplace(slot, std::move(adapter));
}

void BeamModelRunner::record_graphs_afresh() {
  graphs_.reset();
  if (graph_max_num_seqs_ > 0)
    graphs_ = std::make_unique<DecodeGraphs>(*model_, *cache_, graph_max_num_seqs_, capture_routed_experts_);
}

void BeamModelRunner::unload_lora_adapter(int32_t slot) { lora_adapters_.erase(slot); }

std::unique_ptr<ModelStep> BeamModelRunner::launch(const ForwardBatch& batch) {
  require(!asleep_, "the model is asleep (/sleep): /wake_up first");
  if (data_parallel_ != nullptr) return launch_replica(0, batch);
  StepSampler& sampler = *samplers_.front();
  Tensor routed_experts, logits;
  if (groups_ != nullptr) {
    logits = launch_distributed(batch, routed_experts);
  } else {
    const Tensor token_source = batch.deferred_tokens.empty() ? Tensor() : sampler.deferred_source();
    logits = forward(batch, token_source, routed_experts);
  }
  std::unique_ptr<ModelStep> step = sampler.step(logits, batch.logit_rows.size());
  if (!routed_experts.defined()) return step;
  return std::make_unique<RoutedExpertsStep>(std::move(step), *backend_, routed_experts,
                                             static_cast<int64_t>(batch.tokens.size()));
}

ForwardBatch BeamModelRunner::plan_batch(const ForwardBatch& batch, StepSampler& sampler) {
  require(failure_.empty(), "the distributed model stopped after an earlier failure: {}", failure_);
  // The other ranks have no copy of the tokens sampled on this device: they travel in the plan.
  ForwardBatch plan = batch;
  if (!plan.deferred_tokens.empty()) {
    const std::vector<int32_t> sampled = backend_->download_i32(sampler.deferred_source());
    for (const DeferredToken& deferred : plan.deferred_tokens) {
      require(deferred.source >= 0 && deferred.source < static_cast<int32_t>(sampled.size()) && deferred.row >= 0 &&
                  deferred.row < static_cast<int32_t>(plan.tokens.size()),
              "forward batch: deferred token (row {}, source {}) is outside the {} rows or the {} sampled tokens",
              deferred.row, deferred.source, plan.tokens.size(), sampled.size());
      plan.tokens[static_cast<std::size_t>(deferred.row)] = sampled[static_cast<std::size_t>(deferred.source)];
    }
    plan.deferred_tokens.clear();
  }
  ForwardBatch checked = plan;  // forward() asks a step of prompt chunks only for one row it drops; so does the check
  if (checked.logit_rows.empty() && !checked.tokens.empty())
    checked.logit_rows.push_back(static_cast<int32_t>(checked.tokens.size()) - 1);
  model_->validate(checked, *cache_, {});
  return plan;
}

void BeamModelRunner::record_failure(const std::string& cause) {
  failure_ = cause;
  if (failure_handler_) failure_handler_(failure_);
}

Tensor BeamModelRunner::launch_distributed(const ForwardBatch& batch, Tensor& routed_experts) {
  const ReplicaBatches plan{plan_batch(batch, *samplers_.front())};
  // A batch refused before the broadcast (plan_batch) leaves the ranks in step; a failure from here on does not.
  Tensor logits;
  collective([&] {
    std::vector<std::byte> message = encode_step_message(&plan);
    groups_->world->broadcast_bytes(message, 0);
    logits = run_plan(plan, routed_experts);
  });
  return logits;
}

namespace {

// A step of one data-parallel replica, sampled while other engine threads run steps and sample: every use of the
// backend takes the runner's lock.
class SerializedStep : public ModelStep {
 public:
  SerializedStep(std::unique_ptr<ModelStep> step, std::mutex& mutex) : step_(std::move(step)), mutex_(mutex) {}
  void sample(std::vector<RowSampling> rows) override {
    std::lock_guard lock(mutex_);
    step_->sample(std::move(rows));
  }
  std::vector<SampledToken> tokens() override {
    std::lock_guard lock(mutex_);
    return step_->tokens();
  }
  RoutedExperts routed_experts() override {
    std::lock_guard lock(mutex_);
    return step_->routed_experts();
  }
  std::vector<float> raw_logits(std::span<const int32_t> rows) override {
    std::lock_guard lock(mutex_);
    return step_->raw_logits(rows);
  }

 private:
  std::unique_ptr<ModelStep> step_;
  std::mutex& mutex_;
};

}  // namespace

std::unique_ptr<ModelStep> BeamModelRunner::launch_replica(int32_t replica, const ForwardBatch& batch) {
  require(data_parallel_ != nullptr && replica >= 0 && replica < groups_->config.data,
          "launch_replica({}) is for rank 0 of a run with --data-parallel-size {}", replica, data_parallel_size());
  StepSampler& sampler = *samplers_[static_cast<std::size_t>(replica)];
  ForwardBatch plan;
  {
    std::lock_guard lock(backend_mutex_);
    plan = plan_batch(batch, sampler);
  }
  const ReplicaStepOutput output = data_parallel_->launch(replica, std::move(plan));
  std::lock_guard lock(backend_mutex_);
  std::unique_ptr<ModelStep> step = sampler.step(output.logits, batch.logit_rows.size());
  if (output.routed_experts.defined())
    step = std::make_unique<RoutedExpertsStep>(std::move(step), *backend_, output.routed_experts,
                                               static_cast<int64_t>(batch.tokens.size()));
  return std::make_unique<SerializedStep>(std::move(step), backend_mutex_);
}

void BeamModelRunner::replica_idle(int32_t replica) {
  if (data_parallel_ != nullptr) data_parallel_->idle(replica);
}

std::vector<ReplicaStepOutput> BeamModelRunner::run_data_parallel_step(const ReplicaBatches& plan) {
  std::lock_guard lock(backend_mutex_);
  require(failure_.empty(), "the distributed model stopped after an earlier failure: {}", failure_);
  try {
    std::vector<std::byte> message = encode_step_message(&plan);
    groups_->world->broadcast_bytes(message, 0);
    std::vector<ReplicaStepOutput> outputs(plan.size());
    outputs.front().logits = run_plan(plan, outputs.front().routed_experts);
    // Rank 0 samples for every replica: the first rank of each other replica sends its logits (forward()'s rows), then
    // the routing it captured (follow()).
    for (std::size_t r = 1; r < plan.size(); ++r) {
      if (!plan[r].has_value()) continue;
      const ForwardBatch& batch = *plan[r];
      ReplicaStepOutput& output = outputs[r];
      if (!batch.logit_rows.empty()) {
        output.logits = backend_->alloc(DType::F32, {static_cast<int64_t>(batch.logit_rows.size()), vocab_size()});
        groups_->data->recv(output.logits, static_cast<int32_t>(r));
      }
      if (captures_routed_experts(batch)) {
        output.routed_experts = backend_->alloc(
            DType::I32, {model_->num_moe_layers(), static_cast<int64_t>(batch.tokens.size()),
                         model_->config().num_experts_per_tok});
        groups_->data->recv(output.routed_experts, static_cast<int32_t>(r));
      }
    }
    return outputs;
  } catch (const std::exception& error) {
    record_failure(error.what());
    throw;
  }
}

Tensor BeamModelRunner::run_plan(const ReplicaBatches& plan, Tensor& routed_experts) {
  require(static_cast<int32_t>(plan.size()) == groups_->config.data,
          "step message: a plan for {} data-parallel replicas, and --data-parallel-size is {}", plan.size(),
          groups_->config.data);
  const std::optional<ForwardBatch>& batch = plan[static_cast<std::size_t>(groups_->at.data)];
  if (batch.has_value()) return forward(*batch, {}, routed_experts);
  if (groups_->expert && groups_->config.data > 1) model_->dummy_forward();
  return {};
}

void BeamModelRunner::follow() {
  require(groups_ != nullptr && groups_->world_rank != 0, "follow() is for the ranks other than 0");
  const RankCoordinates at = groups_->at;
  for (;;) {
    std::vector<std::byte> bytes;
    groups_->world->broadcast_bytes(bytes, 0, /*wait_forever=*/true);
    const StepMessage message = decode_step_message(bytes);
    if (message.kind == StepMessage::Kind::Stop) return;
    if (message.kind == StepMessage::Kind::Weights) {
      try {
        follow_weight_update(message.weights);
      } catch (const Error& error) {
        if (!failure_.empty()) throw;  // the ranks are out of step
        spdlog::warn("new weights refused, the old ones serve on: {}", error.what());
      }
      continue;
    }
    Tensor routed_experts;  // the stages after the first send theirs to the first (BeamModel::forward)
    const Tensor logits = run_plan(message.plan, routed_experts);
    // Rank 0 samples for every data-parallel replica and hands out its routing (run_data_parallel_step).
    if (at.data > 0 && at.pipeline == 0 && at.tensor == 0) {
      if (logits.defined()) groups_->data->send(logits, 0);
      if (routed_experts.defined()) groups_->data->send(routed_experts, 0);
    }
  }
}

Tensor BeamModelRunner::forward(const ForwardBatch& batch, const Tensor& token_source, Tensor& routed_experts) {
  if (drafter_) {
    last_step_rows_.clear();
    for (const SequenceSlice& slice : batch.sequences)
      last_step_rows_.push_back({slice.token_begin, slice.token_end - slice.token_begin, slice.context_begin});
  }
  // Distributed: tensor-parallel rank 0 of each stage (BeamModel::forward).
  const bool capture = captures_routed_experts(batch) && (groups_ == nullptr || groups_->at.tensor == 0);
  // Eager steps route into a buffer of their own; a replayed graph into the graph's.
  auto eager_routing = [&] {
    if (capture)
      routed_experts = backend_->alloc(DType::I32, {model_->num_moe_layers(), static_cast<int64_t>(batch.tokens.size()),
                                                    model_->config().num_experts_per_tok});
    return routed_experts;
  };
  if (batch.logit_rows.empty() && !batch.tokens.empty()) {
    // A step of prompt chunks only wants no logits, but BeamModel::forward requires at least one row:
    // ask for one and drop it.
    ForwardBatch with_row = batch;
    with_row.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size()) - 1);
    model_->forward(with_row, *cache_, token_source, eager_routing());
    last_captured_ = model_->captured_hidden();
    return {};
  }
  if (graphs_) {
    model_->validate(batch, *cache_, token_source);
    if (std::optional<Tensor> logits = graphs_->forward(batch, token_source, &routed_experts, &last_captured_))
      return *logits;
    Tensor logits = model_->forward_validated(batch, *cache_, token_source, eager_routing());
    last_captured_ = model_->captured_hidden();
    return logits;
  }
  Tensor logits = model_->forward(batch, *cache_, token_source, eager_routing());
  last_captured_ = model_->captured_hidden();
  return logits;
}

}  // namespace beamline

namespace beamline {

void BeamModelRunner::commit_draft_context(std::span<const StepVerified> sequences) {
  std::vector<VerifiedRows> rows;
  for (const StepVerified& sequence : sequences) {
    require(sequence.batch_index >= 0 && sequence.batch_index < static_cast<int32_t>(last_step_rows_.size()),
            "draft context: sequence {} of a step of {}", sequence.batch_index, last_step_rows_.size());
    const StepRows& step = last_step_rows_[static_cast<std::size_t>(sequence.batch_index)];
    // A row at position t holds the target's state after tokens 0..t: verified when t < verified_length.
    const int64_t verified = std::min<int64_t>(step.count, sequence.verified_length - step.first_position);
    if (verified > 0)
      rows.push_back({sequence.sequence_id, step.first_row, step.first_position, static_cast<int32_t>(verified)});
  }
  drafter_->commit(rows, last_captured_);
}

void BeamModelRunner::truncate_draft_context(int64_t sequence_id, int64_t verified_length) {
  drafter_->truncate(sequence_id, verified_length);
}

std::vector<DraftProposal> BeamModelRunner::propose_drafts(std::span<const DraftRequest> requests,
                                                          int32_t num_tokens) {
  std::vector<DraftAnchor> anchors;
  for (const DraftRequest& request : requests) anchors.push_back({request.sequence_id, request.position, request.token});
  return drafter_->propose(anchors, num_tokens);
}

void BeamModelRunner::forget_sequence(int64_t sequence_id) {
  if (drafter_) drafter_->forget(sequence_id);
}

}  // namespace beamline

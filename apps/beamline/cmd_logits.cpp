// beamline logits: the soft-capped logits of every position of a token sequence (one prefill) as float32 .npy; with the
// parallel flags, from the model sharded over that many ranks (docs/parallel.md), rank 0 writing the file.
#include <spdlog/spdlog.h>

#include <chrono>
#include <string>

#include "backend/backend.h"
#include "backend/registry.h"
#include "commands.h"
#include "engine/engine_config.h"
#include "model/beam_model.h"
#include "checkpoint/shard_weights.h"
#include "model/weights.h"
#include "model_options.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_groups.h"
#include "parallel_options.h"
#include "runner/sequence_runner.h"
#include "spec/block_drafter.h"
#include "token_list.h"
#include "util/error.h"
#include "util/npy.h"

namespace beamline::cli {
namespace {

struct LogitsOptions {
  ModelSource source;
  std::string tokens, out, device = "auto", dtype = "auto", kv_cache_dtype = "auto";
  bool calculate_kv_scales = false;
  std::string drafter;  // --drafter: the block logits of a draft at the last token instead
  ParallelConfig parallel;
};

// `world` null: one process.
void compute_logits(const LogitsOptions& options, MpiWorld* world) {
  if (world != nullptr && options.device != "cpu") world->use_local_gpu();
  std::unique_ptr<Backend> backend = create_backend(options.device);
  backend->set_compute_dtype(parse_compute_dtype(options.dtype, backend->device()));
  ModelSource source = options.source;
  if (world != nullptr) {
    source.parallel = options.parallel;
    source.world_rank = world->rank();
  }
  const BeamWeights weights = source.load();
  const std::vector<int32_t> tokens = parse_token_list(options.tokens, weights.config.vocab_size, "--tokens");
  std::unique_ptr<ParallelGroups> groups;
  ModelShard shard = ModelShard::whole(weights.config);
  if (world != nullptr) {
    groups = make_parallel_groups(*world, options.parallel, *backend);
    shard = model_shard(weights.config, options.parallel, groups->at);
  }
  BeamModel model(groups ? shard_weights(weights, shard) : weights, *backend, shard, groups.get());
  if (options.calculate_kv_scales) model.calculate_kv_scales();
  const auto count = static_cast<int64_t>(tokens.size());
  SequenceRunner runner(model, count, count, parse_kv_cache_dtype(options.kv_cache_dtype, backend->compute_dtype()));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> logits = runner.step(tokens, true);
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  if (world != nullptr && world->rank() != 0) return;  // rank 0 has the gathered logits
  write_npy(options.out, logits, {count, weights.config.vocab_size});
  spdlog::info("logits [{}, {}] of {} tokens in {:.3f} s on {} -> {}", count, weights.config.vocab_size, count,
               elapsed.count(), backend->name(), options.out);
}

// --drafter: the target runs over tokens[0..P-1], the drafter drafts at anchor P = the last token; its block logits of
// rows 1..B-1 go to the file, [B - 1, vocab_size] (tools/reference/check_drafter_against_beamline.py compares them).
void compute_block_logits(const LogitsOptions& options) {
  std::unique_ptr<Backend> backend = create_backend(options.device);
  backend->set_compute_dtype(parse_compute_dtype(options.dtype, backend->device()));
  const BeamWeights weights = options.source.load();
  const std::vector<int32_t> tokens = parse_token_list(options.tokens, weights.config.vocab_size, "--tokens");
  BeamModel model(weights, *backend);
  if (options.calculate_kv_scales) model.calculate_kv_scales();
  const DrafterConfig config = DrafterConfig::load(options.drafter);
  const auto block = static_cast<int32_t>(config.block_size);
  BlockDrafter drafter(load_drafter_checkpoint(options.drafter, weights.config, block - 1), model, 1);
  const auto anchor = static_cast<int64_t>(tokens.size()) - 1;
  if (anchor > 0) {
    SequenceRunner runner(model, anchor, anchor, parse_kv_cache_dtype(options.kv_cache_dtype, backend->compute_dtype()));
    runner.step(std::span(tokens).first(static_cast<std::size_t>(anchor)), false);
    const VerifiedRows context{0, 0, 0, static_cast<int32_t>(anchor)};
    drafter.commit(std::span(&context, 1), model.captured_hidden());
  }
  const DraftAnchor draft{0, anchor, tokens.back()};
  const BlockDrafter::BlockLogits pass = drafter.block_logits(std::span(&draft, 1), block - 1);
  write_npy(options.out, backend->download_f32(pass.logits), {block - 1, weights.config.vocab_size});
  spdlog::info("block logits [{}, {}] of a draft at position {} on {} -> {}", block - 1, weights.config.vocab_size,
               anchor, backend->name(), options.out);
}

void run_logits(const LogitsOptions& options) {
  check_calculate_kv_scales(options.calculate_kv_scales, options.kv_cache_dtype);
  if (!options.drafter.empty()) {
    require(options.parallel.world_size() == 1, "logits --drafter: runs on one process (no parallel flags)");
    return compute_block_logits(options);
  }
  options.parallel.validate();
  relaunch_under_mpirun_unless_launched(options.parallel);
  if (!launched_by_mpi()) return compute_logits(options, nullptr);
  MpiWorld world(options.parallel.timeout_seconds);
  prefix_logs_with_rank(world.rank());
  try {
    compute_logits(options, &world);
  } catch (const std::exception& error) {
    world.fail(error.what());
  }
}

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<LogitsOptions>();
  CLI::App* command = app.add_subcommand(
      "logits", "Write the soft-capped logits of every position of a token sequence (one prefill) to a float32 .npy "
                "of shape [num_tokens, vocab_size]");
  add_model_source_options(*command, options->source);
  command->add_option("--tokens", options->tokens, "comma-separated token ids, e.g. 5,17,300")->required();
  command->add_option("--out", options->out, "output .npy file")->required();
  command->add_option("--device", options->device, "auto (cuda where a GPU is present, else cpu), cpu or cuda")->capture_default_str();
  command->add_option("--drafter", options->drafter,
                      "a dflash drafter directory: write instead the block logits [block_size - 1, vocab_size] of its "
                      "draft at the last token (the target runs over the tokens before it)");
  add_dtype_options(*command, options->dtype, options->kv_cache_dtype, options->calculate_kv_scales);
  add_parallel_options(*command, options->parallel);
  command->callback([options] { run_logits(*options); });
});

}  // namespace
}  // namespace beamline::cli

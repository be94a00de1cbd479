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
#include "token_list.h"
#include "util/npy.h"

namespace beamline::cli {
namespace {

struct LogitsOptions {
  ModelSource source;
  std::string tokens, out, device = "auto", dtype = "auto", kv_cache_dtype = "auto";
  ParallelConfig parallel;
};

// `world` null: one process.
void compute_logits(const LogitsOptions& options, MpiWorld* world) {
  if (world != nullptr && options.device != "cpu") world->use_local_gpu();
  std::unique_ptr<Backend> backend = create_backend(options.device);
  backend->set_compute_dtype(parse_compute_dtype(options.dtype, backend->device()));
  const BeamWeights weights = options.source.load();
  const std::vector<int32_t> tokens = parse_token_list(options.tokens, weights.config.vocab_size, "--tokens");
  std::unique_ptr<ParallelGroups> groups;
  ModelShard shard = ModelShard::whole(weights.config);
  if (world != nullptr) {
    groups = make_parallel_groups(*world, options.parallel, *backend);
    shard = model_shard(weights.config, options.parallel, groups->at);
  }
  BeamModel model(groups ? shard_weights(weights, shard) : weights, *backend, shard, groups.get());
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

void run_logits(const LogitsOptions& options) {
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
  add_dtype_options(*command, options->dtype, options->kv_cache_dtype);
  add_parallel_options(*command, options->parallel);
  command->callback([options] { run_logits(*options); });
});

}  // namespace
}  // namespace beamline::cli

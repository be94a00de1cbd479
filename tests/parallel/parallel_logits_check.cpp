// Run under mpirun (tests/parallel/CMakeLists.txt): a random MoE model sharded over the ranks with the given layout
// gives, on the CPU backend, the logits of the whole model on one rank (max |sharded - whole| <= 1e-5 x max |whole|).
// Every data-parallel rank feeds its own sequence (of its own length, so the expert layers see padded batches):
// one prefill, two decode steps and a chunk, the logits of every position compared.
//   parallel_logits_check --tp N --pp N --dp N [--ep] [--dummy]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "checkpoint/shard_weights.h"
#include "model/beam_model.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_groups.h"
#include "runner/sequence_runner.h"
#include "util/error.h"

namespace beamline {
namespace {

constexpr double kTolerance = 1e-5;

// tiny (6 layers, 2 of them full attention; 4 query and 2 KV heads) with 8 experts, top 2 of 4 groups.
ModelConfig test_config() {
  ModelConfig config = preset_config("tiny");
  require(config.n_routed_experts >= 8 && config.num_hidden_layers >= 6, "the tiny preset changed: adjust this test");
  return config;
}

ParallelConfig parse(int argc, char** argv, bool& dummy) {
  ParallelConfig config;
  config.timeout_seconds = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] {
      require(i + 1 < argc, "{} needs a value", arg);
      return std::atoi(argv[++i]);
    };
    if (arg == "--tp") config.tensor = value();
    else if (arg == "--pp") config.pipeline = value();
    else if (arg == "--dp") config.data = value();
    else if (arg == "--ep") config.expert = true;
    else if (arg == "--dummy") dummy = true;
    else fail("unknown argument {}", arg);
  }
  return config;
}

std::vector<int32_t> sequence_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> tokens;
  uint32_t state = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    tokens.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(vocab)));
  }
  return tokens;
}

// The logits of every position of `tokens`, fed as a prefill, two decode steps and a chunk of the rest.
std::vector<float> run_steps(BeamModel& model, const std::vector<int32_t>& tokens, int64_t prefill) {
  const auto total = static_cast<int64_t>(tokens.size());
  SequenceRunner runner(model, total, total, DType::F32);
  std::vector<float> logits;
  for (int64_t at = 0; at < total;) {
    const int64_t step = at == 0 ? prefill : (at < prefill + 2 ? 1 : total - at);
    const std::vector<float> part = runner.step(std::span(tokens).subspan(at, step), true);
    logits.insert(logits.end(), part.begin(), part.end());
    at += step;
  }
  return logits;
}

int check(int argc, char** argv) {
  bool dummy = false;
  const ParallelConfig parallel = parse(argc, argv, dummy);
  MpiWorld world(parallel.timeout_seconds);
  std::unique_ptr<Backend> whole_backend = create_backend("cpu"), shard_backend = create_backend("cpu");
  std::unique_ptr<ParallelGroups> groups = make_parallel_groups(world, parallel, *shard_backend);
  const ModelConfig config = test_config();

  // Rank 0 writes the checkpoint; every rank maps it and takes its slices.
  std::filesystem::path dir;
  if (!dummy) {
    std::string path = (std::filesystem::temp_directory_path() / ("beamline-parallel-" + std::to_string(getpid()))).string();
    std::vector<std::byte> bytes(path.size());
    std::memcpy(bytes.data(), path.data(), path.size());
    groups->world->broadcast_bytes(bytes, 0);
    dir = std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (world.rank() == 0) write_random_checkpoint(config, dir, 11);
    groups->world->barrier();
  }
  const BeamWeights weights = dummy ? dummy_weights(config, 11) : load_checkpoint(dir);

  const ModelShard shard = model_shard(config, parallel, groups->at);
  BeamModel whole(weights, *whole_backend);
  BeamModel sharded(shard_weights(weights, shard), *shard_backend, shard, groups.get());

  const std::vector<int32_t> tokens = sequence_tokens(12 + 3 * groups->at.data, config.vocab_size, groups->at.data);
  const std::vector<float> expected = run_steps(whole, tokens, 7 + groups->at.data);
  const std::vector<float> actual = run_steps(sharded, tokens, 7 + groups->at.data);
  groups->world->barrier();
  if (world.rank() == 0 && !dummy) std::filesystem::remove_all(dir);

  if (!groups->first_stage()) return 0;  // the logits come back on the first stage
  require(actual.size() == expected.size(), "rank {}: {} logits, expected {}", world.rank(), actual.size(),
          expected.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    worst = std::max(worst, std::abs(double{actual[i]} - double{expected[i]}));
    scale = std::max(scale, std::abs(double{expected[i]}));
  }
  const double relative = worst / scale;
  spdlog::info("rank {} (data {}, stage {}, tensor {}): {} logits, max |difference| {:.3g} = {:.3g} of max |logit| {:.3g}",
               world.rank(), groups->at.data, groups->at.pipeline, groups->at.tensor, actual.size(), worst, relative,
               scale);
  require(std::isfinite(relative) && relative <= kTolerance, "rank {}: relative difference {:.3g} exceeds {:.0e}",
          world.rank(), relative, kTolerance);
  return 0;
}

}  // namespace
}  // namespace beamline

int main(int argc, char** argv) {
  try {
    return beamline::check(argc, argv);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    return 1;
  }
}

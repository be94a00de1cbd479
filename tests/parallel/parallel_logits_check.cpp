// Run under mpirun (tests/parallel/CMakeLists.txt): a random MoE model sharded over the ranks with the given layout
// gives, on the CPU backend, the logits of the whole model on one rank (max |sharded - whole| <= 1e-5 x max |whole|).
// Every data-parallel rank feeds its own sequence (of its own length, so the expert layers see padded batches):
// one prefill, two decode steps and a chunk, the logits of every position compared.
//   parallel_logits_check --tp N --pp N --dp N [--ep] [--dummy] [--preset tiny|cut|aligned|split]
//                         [--quantization fp8|mxfp8|nvfp4 [--at-load]]
// With --quantization both models compute with the same quantized weights (docs/parallel.md, Quantized weights):
// a checkpoint written quantized (every projection, the LM head included), or with --at-load a float checkpoint
// quantized as it loads (--quantization at load: the LM head kept), or with --dummy dummy weights quantized at load.
// The presets: `tiny`; `cut`, whose per-rank widths at TP2 and TP4 are parts of fp8's 128-blocks (each rank keeps a
// copy of a block's scale) but whole mxfp8/nvfp4 groups; `aligned`, whose per-rank widths are whole 128-blocks;
// `split`, `cut` with 192-row experts, whose halves fp8 cannot hold (the second starts inside a block and leaves it).
#include <spdlog/spdlog.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "checkpoint/quantize_tensors.h"
#include "checkpoint/shard_weights.h"
#include "model/beam_model.h"
#include "mpi_check.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_groups.h"
#include "runner/sequence_runner.h"
#include "util/error.h"

namespace beamline {
namespace {

constexpr double kTolerance = 1e-5;

struct Options {
  ParallelConfig parallel;
  bool dummy = false, at_load = false;
  std::string preset = "tiny", quantization;
};

// tiny (6 layers, 2 of them full attention; 4 query and 2 KV heads) with 8 experts, top 2 of 4 groups, or its
// widened forms `cut` and `aligned` (above).
ModelConfig test_config(const std::string& preset) {
  ModelConfig config = preset_config("tiny");
  require(config.n_routed_experts >= 8 && config.num_hidden_layers >= 6, "the tiny preset changed: adjust this test");
  if (preset == "tiny") return config;
  require(preset == "cut" || preset == "aligned" || preset == "split", "--preset: tiny, cut, aligned or split, not {}",
          preset);
  const int64_t width = preset == "aligned" ? 128 : 32;  // head_dim; the intermediate sizes follow it
  config.hidden_size = 128;
  config.head_dim = width;
  config.intermediate_size = 4 * width;
  config.moe_intermediate_size = preset == "split" ? 6 * width : 4 * width;
  return config;
}

Options parse(int argc, char** argv) {
  Options options;
  options.parallel = parse_check_args(argc, argv, 60, [&](const std::string& flag, const auto& value) {
    if (flag == "--dummy") options.dummy = true;
    else if (flag == "--at-load") options.at_load = true;
    else if (flag == "--preset") options.preset = value();
    else if (flag == "--quantization") options.quantization = value();
    else return false;
    return true;
  });
  return options;
}

// Rank 0 writes a random checkpoint (quantized unless it is to be quantized at load) into `dir`.
void write_checkpoint(const ModelConfig& config, const Options& options, const std::filesystem::path& dir) {
  if (options.quantization.empty() || options.at_load) return write_random_checkpoint(config, dir, 11);
  ModelConfig quantized = config;
  quantized.quantization = quantization_config_for(parse_quantization_flag(options.quantization), {});
  write_model_files(quantized, dir);
  write_safetensors_checkpoint(
      dir, quantized_sources(quantized, random_checkpoint_tensors(config, 11, DType::BF16), *quantized.quantization));
}

// The weights every rank computes with: the checkpoint's, or dummy ones; quantized at load where asked, as
// `--quantization` does (the LM head kept): for `shard`, only what it computes, as a rank of a server does.
BeamWeights load_weights(const ModelConfig& config, const Options& options, const std::filesystem::path& dir,
                         const std::optional<ModelShard>& shard) {
  BeamWeights weights = options.dummy ? dummy_weights(config, 11) : load_checkpoint(dir);
  if (options.quantization.empty() || !(options.dummy || options.at_load)) return weights;
  return quantize_weights(std::move(weights),
                          quantization_config_for(parse_quantization_flag(options.quantization), {"lm_head"}), shard);
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
  const Options options = parse(argc, argv);
  const ParallelConfig& parallel = options.parallel;
  MpiWorld world(parallel.timeout_seconds);
  std::unique_ptr<Backend> whole_backend = create_backend("cpu"), shard_backend = create_backend("cpu");
  std::unique_ptr<ParallelGroups> groups = make_parallel_groups(world, parallel, *shard_backend);
  const ModelConfig config = test_config(options.preset);

  // Rank 0 writes the checkpoint; every rank maps it and takes its slices.
  std::filesystem::path dir;
  if (!options.dummy) {
    dir = shared_scratch_path(*groups->world, "beamline-parallel");
    if (world.rank() == 0) write_checkpoint(config, options, dir);
    groups->world->barrier();
  }
  const ModelShard shard = model_shard(config, parallel, groups->at);
  const BeamWeights weights = load_weights(config, options, dir, std::nullopt);
  require(options.quantization.empty() || weights.layers.at(0).q_proj.quantized(), "the weights are not quantized");

  BeamModel whole(weights, *whole_backend);
  BeamModel sharded(shard_weights(load_weights(config, options, dir, shard), shard), *shard_backend, shard,
                    groups.get());

  const std::vector<int32_t> tokens = sequence_tokens(12 + 3 * groups->at.data, config.vocab_size, groups->at.data);
  const std::vector<float> expected = run_steps(whole, tokens, 7 + groups->at.data);
  const std::vector<float> actual = run_steps(sharded, tokens, 7 + groups->at.data);
  groups->world->barrier();
  if (world.rank() == 0 && !options.dummy) std::filesystem::remove_all(dir);

  if (!groups->first_stage()) return 0;  // the logits come back on the first stage
  const LogitsDifference difference = logits_difference(actual, expected, fmt::format("rank {}", world.rank()));
  spdlog::info("rank {} (data {}, stage {}, tensor {}): {} logits, max |difference| {:.3g} = {:.3g} of max |logit| {:.3g}",
               world.rank(), groups->at.data, groups->at.pipeline, groups->at.tensor, actual.size(), difference.worst,
               difference.relative(), difference.scale);
  require(difference.within(kTolerance), "rank {}: relative difference {:.3g} exceeds {:.0e}", world.rank(),
          difference.relative(), kTolerance);
  return 0;
}

}  // namespace
}  // namespace beamline

int main(int argc, char** argv) { return beamline::run_check(beamline::check, argc, argv); }

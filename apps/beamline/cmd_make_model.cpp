// beamline make-model: write a random-weights checkpoint of a preset or a config.json, for tests and benchmarks.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "checkpoint/quantize_tensors.h"
#include "checkpoint/safetensors.h"
#include "commands.h"
#include "model/checkpoint_layout.h"
#include "model_options.h"
#include "runner/kv_cache.h"
#include "util/error.h"

namespace beamline::cli {
namespace {

struct MakeModelOptions {
  std::string preset;
  std::string config_file;
  std::string out;
  std::string drafter_out;  // a random block drafter for the model, written there
  uint64_t seed = 0;
  std::string dtype = "bf16";
  std::optional<int64_t> layers;
  std::optional<int64_t> kv_tokens;  // --dry-run: the sequence length of the KV prediction
  uint64_t max_shard_mb = kDefaultMaxShardBytes >> 20;
  bool dry_run = false;
  bool no_weights = false;
  bool force = false;
  std::string quantization;                                   // fp8 | mxfp8 | nvfp4, or empty
  std::vector<std::string> modules_to_not_convert{"lm_head"};  // with --quantization
};

DType parse_dtype(const std::string& name) {
  if (name == "bf16") return DType::BF16;
  if (name == "f16") return DType::F16;
  return DType::F32;
}

// KV memory of one sequence of `tokens` tokens (runner/kv_cache.h's prediction), per KV dtype.
void print_kv_prediction(const ModelConfig& config, int64_t tokens) {
  const KvCacheLayout layout = make_kv_cache_layout(config, default_block_size(config), 0);
  for (const auto& [name, dtype] : {std::pair{"bfloat16", DType::BF16}, std::pair{"fp8", DType::F8_E4M3}}) {
    const KvMemoryPrediction p = predict_kv_memory(config, layout, dtype, tokens);
    std::printf("kv %s: %lld bytes per token (%lld full-attention layers), %lld bytes for the window of %lld sliding "
                "layers; %lld tokens: %lld bytes, %lld blocks of %lld bytes held while decoding (%lld bytes)\n",
                name, static_cast<long long>(p.bytes_per_token), static_cast<long long>(p.full_layers),
                static_cast<long long>(p.sliding_bytes), static_cast<long long>(p.sliding_layers),
                static_cast<long long>(tokens), static_cast<long long>(p.bytes),
                static_cast<long long>(p.full_blocks + p.sliding_blocks), static_cast<long long>(p.block_bytes),
                static_cast<long long>(p.held_bytes()));
  }
}

// The tensor list with shapes and dtypes, parameter counts and the file split, without writing anything.
// Parameters are counted on the unquantized model (expected_tensors); bytes on what would be written.
void print_dry_run(const ModelConfig& config, const std::vector<TensorSource>& tensors, uint64_t max_shard_bytes,
                   int64_t kv_tokens) {
  uint64_t parameters = 0, bytes = 0, shards = 1, shard_bytes = 0;
  for (const ExpectedTensor& expected : expected_tensors(config)) {
    uint64_t numel = 1;
    for (int64_t dim : expected.shape) numel *= static_cast<uint64_t>(dim);
    parameters += numel;
  }
  for (const TensorSource& tensor : tensors) {
    std::printf("%s %s %s\n", tensor.name.c_str(), std::string(dtype_name(tensor.dtype)).c_str(),
                shape_string(tensor.shape).c_str());
    bytes += tensor.nbytes();
    if (shard_bytes > 0 && shard_bytes + tensor.nbytes() > max_shard_bytes) ++shards, shard_bytes = 0;
    shard_bytes += tensor.nbytes();
  }
  const uint64_t moe_layers = static_cast<uint64_t>(config.num_hidden_layers - config.first_k_dense_replace);
  const uint64_t inactive_experts = static_cast<uint64_t>(config.n_routed_experts - config.num_experts_per_tok);
  const uint64_t expert_parameters = 3 * static_cast<uint64_t>(config.moe_intermediate_size * config.hidden_size);
  std::printf("tensors: %zu\n", tensors.size());
  std::printf("parameters: %llu\n", static_cast<unsigned long long>(parameters));
  std::printf("active parameters per token: %llu\n",
              static_cast<unsigned long long>(parameters - moe_layers * inactive_experts * expert_parameters));
  std::printf("bytes: %llu\n", static_cast<unsigned long long>(bytes));
  std::printf("files: %llu\n", static_cast<unsigned long long>(shards));
  print_kv_prediction(config, kv_tokens);
}

void prepare_output_dir(const std::filesystem::path& dir, bool force) {
  std::error_code error;
  if (std::filesystem::exists(dir, error)) {
    require(std::filesystem::is_directory(dir, error), "--out {}: exists and is not a directory", dir.string());
    require(force || std::filesystem::is_empty(dir, error), "--out {}: directory is not empty (--force overwrites)",
            dir.string());
  }
  std::filesystem::create_directories(dir, error);
  if (error) fail("--out {}: cannot create directory: {}", dir.string(), error.message());
}

void make_model(const MakeModelOptions& options) {
  require(options.preset.empty() != options.config_file.empty(), "make-model: give exactly one of --preset or --config");
  ModelConfig config = options.preset.empty() ? ModelConfig::load(options.config_file) : preset_config(options.preset);
  if (options.layers) config = with_num_layers(config, *options.layers);
  const DType dtype = parse_dtype(options.dtype);
  const uint64_t max_shard_bytes = options.max_shard_mb << 20;
  require(max_shard_bytes > 0, "--max-shard-mb must be positive");
  std::vector<TensorSource> tensors = random_checkpoint_tensors(config, options.seed, dtype);
  if (!options.quantization.empty()) {
    config.quantization = quantize_options_config(options.quantization, options.modules_to_not_convert);
    tensors = quantized_sources(config, std::move(tensors), *config.quantization);
  }

  if (options.dry_run) {
    print_dry_run(config, tensors, max_shard_bytes, options.kv_tokens.value_or(config.max_position_embeddings));
    return;
  }
  if (!options.drafter_out.empty()) {
    write_random_drafter(random_drafter_config(config), options.drafter_out, options.seed, dtype);
    spdlog::info("wrote a random block drafter for {} to {}", options.preset.empty() ? options.config_file : options.preset,
                 options.drafter_out);
    if (options.out.empty()) return;
  }
  require(!options.out.empty(), "make-model: --out DIR is required (unless --dry-run or --drafter-out)");
  const std::filesystem::path dir(options.out);
  prepare_output_dir(dir, options.force);
  if (options.no_weights) {
    write_model_files(config, dir);
    spdlog::info("wrote the config, tokenizer and templates of {} ({} layers) to {}: serve it with --load-format dummy",
                 options.preset.empty() ? options.config_file : options.preset, config.num_hidden_layers, dir.string());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  write_model_files(config, dir);
  write_safetensors_checkpoint(dir, tensors, max_shard_bytes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("wrote {} ({} layers, {} experts, {}{}) in {:.1f} s", dir.string(), config.num_hidden_layers,
               config.n_routed_experts, dtype_name(dtype), options.quantization.empty() ? "" : ", " + options.quantization,
               seconds);
}

const CommandRegistration registration([](CLI::App& app) {
  auto* command = app.add_subcommand(
      "make-model",
      "Write a random-weights checkpoint (config.json, safetensors, tokenizer.json, generation_config.json, "
      "harmony.json) of a preset or a config.json");
  auto options = std::make_shared<MakeModelOptions>();
  std::string preset_help = "model preset:";
  for (const std::string& name : preset_names()) preset_help += " " + name;
  auto* preset = command->add_option("--preset", options->preset, preset_help)->check(CLI::IsMember(preset_names()));
  auto* config = command->add_option("--config", options->config_file, "config.json to take the shapes from")
                     ->check(CLI::ExistingFile);
  preset->excludes(config);
  command->add_option("--out", options->out, "output directory (created; must be empty unless --force)");
  command->add_option("--drafter-out", options->drafter_out,
                      "also write a random dflash block drafter that fits the model to this directory (alone: only it)");
  command->add_option("--seed", options->seed, "random seed (same seed, same bytes)")->capture_default_str();
  command->add_option("--dtype", options->dtype, "storage type of all weights but the F32 router")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}))
      ->capture_default_str();
  command->add_option("--layers", options->layers, "override num_hidden_layers (dense layers and the layer_types rule kept)")
      ->check(CLI::PositiveNumber);
  command->add_option("--max-shard-mb", options->max_shard_mb,
                      "largest safetensors file in MiB; bigger checkpoints are sharded with an index")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_flag("--no-weights", options->no_weights,
                    "write config.json, the tokenizer and templates only: a model directory for --load-format dummy");
  command->add_flag("--dry-run", options->dry_run,
                    "print the tensors (name dtype shape), totals and the KV memory of one sequence; write nothing");
  command->add_option("--kv-tokens", options->kv_tokens,
                      "--dry-run: the sequence length of the KV prediction (default: max_position_embeddings)")
      ->check(CLI::PositiveNumber);
  command->add_flag("--force", options->force, "write into a non-empty --out, replacing the checkpoint files there");
  add_quantize_options(*command, options->quantization, options->modules_to_not_convert);
  command->callback([options] { make_model(*options); });
});

}  // namespace
}  // namespace beamline::cli

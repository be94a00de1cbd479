// beamline quantize: a float checkpoint rewritten with its projections in one of docs/model-format.md §5's layouts
// and the quantization_config vLLM reads, streamed tensor by tensor in bounded memory.
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/quantize_tensors.h"
#include "checkpoint/safetensors.h"
#include "commands.h"
#include "model/checkpoint_layout.h"
#include "model_options.h"
#include "util/error.h"

namespace beamline::cli {
namespace {

namespace fs = std::filesystem;

struct QuantizeOptions {
  std::string model, out, quantization;
  std::vector<std::string> modules_to_not_convert{"lm_head"};
  uint64_t max_shard_mb = kDefaultMaxShardBytes >> 20;
  bool force = false;
};

// Every tensor the model uses, straight from the input's mapped files.
std::vector<TensorSource> checkpoint_sources(const BeamWeights& weights) {
  std::vector<TensorSource> sources;
  for (const ExpectedTensor& expected : expected_tensors(weights.config)) {
    const TensorView view = weights.archive->at(expected.name);
    sources.push_back(TensorSource{view.name, view.dtype, view.shape, [view](std::size_t offset, std::span<std::byte> out) {
                                     std::memcpy(out.data(), view.data + offset, out.size());
                                   }});
  }
  return sources;
}

// config.json as it was (keys beamline does not read kept) with the new quantization_config.
void write_config(const fs::path& in, const fs::path& out, const ModelConfig& quantized) {
  std::ifstream file(in / "config.json");
  nlohmann::json config = nlohmann::json::parse(file);
  config["quantization_config"] = quantized.to_json()["quantization_config"];
  write_text_file(out / "config.json", config.dump(2) + "\n");
}

// The input's other files (tokenizer, generation config, templates), top level only.
void copy_model_files(const fs::path& in, const fs::path& out) {
  for (const auto& entry : fs::directory_iterator(in)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == "config.json" || name.ends_with(".safetensors") ||
        name == kSafetensorsIndexFile)
      continue;
    fs::copy_file(entry.path(), out / name, fs::copy_options::overwrite_existing);
  }
}

void quantize(const QuantizeOptions& options) {
  const fs::path in(options.model), out(options.out);
  require(fs::weakly_canonical(in) != fs::weakly_canonical(out), "--out {}: must differ from --model", out.string());
  const BeamWeights weights = load_checkpoint(in);  // validates every tensor against the config first
  if (const auto& existing = weights.config.quantization)
    fail("--model {}: already quantized (quantization_config.quant_method \"{}\"); quantize a BF16, F16 or F32 "
         "checkpoint", in.string(), existing->quant_method);
  ModelConfig config = weights.config;
  config.quantization = quantize_options_config(options.quantization, options.modules_to_not_convert);

  std::error_code error;
  if (fs::exists(out, error))
    require(options.force || fs::is_empty(out, error), "--out {}: directory is not empty (--force overwrites)",
            out.string());
  fs::create_directories(out, error);
  if (error) fail("--out {}: cannot create directory: {}", out.string(), error.message());

  const auto start = std::chrono::steady_clock::now();
  const std::vector<TensorSource> tensors = quantized_sources(config, checkpoint_sources(weights), *config.quantization);
  write_safetensors_checkpoint(out, tensors, options.max_shard_mb << 20);
  copy_model_files(in, out);
  write_config(in, out, config);
  uint64_t bytes = 0;
  for (const TensorSource& tensor : tensors) bytes += tensor.nbytes();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("wrote {} ({}, {} bytes of weights) in {:.1f} s", out.string(), options.quantization, bytes, seconds);
}

const CommandRegistration registration([](CLI::App& app) {
  auto* command = app.add_subcommand(
      "quantize", "Rewrite a BF16/F16/F32 checkpoint with its projections quantized (fp8 block-128, mxfp8, nvfp4) and "
                  "the quantization_config vLLM reads; router, norms and embeddings kept");
  auto options = std::make_shared<QuantizeOptions>();
  command->add_option("--model", options->model, "the float checkpoint directory")->required()->check(CLI::ExistingDirectory);
  command->add_option("--out", options->out, "output directory (created; must be empty unless --force)")->required();
  add_quantize_options(*command, options->quantization, options->modules_to_not_convert);
  command->get_option("--quantization")->required();
  command->add_option("--max-shard-mb", options->max_shard_mb, "largest safetensors file in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_flag("--force", options->force, "write into a non-empty --out, replacing the checkpoint files there");
  command->callback([options] { quantize(*options); });
});

}  // namespace
}  // namespace beamline::cli

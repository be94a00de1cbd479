#pragma once
// Random PEFT LoRA adapters written to disk, and the checkpoint with an adapter merged into its weights
// (W + scale * B A): the reference a served adapter must reproduce (docs/lora.md).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/safetensors.h"
#include "model/beam_model.h"
#include "runner/sequence_runner.h"

namespace beamline::testing {

struct RandomAdapter {
  int64_t rank = 4;
  double alpha = 8.0;
  bool rslora = false;
  std::vector<std::string> target_modules;
  std::vector<std::string> modules;  // "model.layers.0.self_attn.q_proj", ".. .mlp.experts.3.down_proj"
  // Modules written at their own rank (true-rank experts; the config's rank_pattern must say so), others at `rank`.
  std::map<std::string, int64_t> module_ranks;
  std::map<std::string, double> module_alphas;  // alpha_pattern's, others `alpha`
  uint64_t seed = 1;

  int64_t rank_of(const std::string& module) const {
    const auto found = module_ranks.find(module);
    return found == module_ranks.end() ? rank : found->second;
  }
  // The module's alpha over its own rank (PEFT's and Megatron-Bridge's scale for a rank_pattern / normalize_moe_lora
  // rank).
  double scale_of(const std::string& module) const {
    const auto found = module_alphas.find(module);
    const double a = found == module_alphas.end() ? alpha : found->second;
    const auto r = static_cast<double>(rank_of(module));
    return rslora ? a / std::sqrt(r) : a / r;
  }
};

// A module's A [rank, in] and B [out, rank] as written, and the scale the merged reference applies.
struct AdapterTensors {
  std::vector<float> a, b;
  int64_t in = 0, out = 0, rank = 0;
  double scale = 1.0;
};

// The [out, in] of a module of `weights_dir`'s checkpoint.
inline std::vector<int64_t> module_shape(const SafetensorsArchive& archive, const std::string& module) {
  return archive.at(module + ".weight").shape;
}

// Writes adapter_config.json and adapter_model.safetensors (F32) into `dir`, with `extra_config` merged into the
// config; returns what it wrote, by module.
inline std::map<std::string, AdapterTensors> write_random_adapter(const RandomAdapter& spec,
                                                                   const SafetensorsArchive& base,
                                                                   const std::filesystem::path& dir,
                                                                   const nlohmann::json& extra_config = {}) {
  std::filesystem::create_directories(dir);
  nlohmann::json config = {{"peft_type", "LORA"},          {"r", spec.rank},
                           {"lora_alpha", spec.alpha},       {"use_rslora", spec.rslora},
                           {"target_modules", spec.target_modules}, {"bias", "none"},
                           {"lora_dropout", 0.0},           {"base_model_name_or_path", "tiny"}};
  if (extra_config.is_object()) config.update(extra_config);
  write_text_file(dir / "adapter_config.json", config.dump(2));
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::map<std::string, AdapterTensors> written;
  std::vector<TensorSource> tensors;
  for (const std::string& module : spec.modules) {
    const std::vector<int64_t> shape = module_shape(base, module);
    AdapterTensors& t = written[module];
    t.out = shape[0];
    t.in = shape[1];
    t.rank = spec.rank_of(module);
    t.scale = spec.scale_of(module);
    for (int64_t i = 0; i < t.rank * t.in; ++i) t.a.push_back(0.3f * normal(rng));
    for (int64_t i = 0; i < t.out * t.rank; ++i) t.b.push_back(0.05f * normal(rng));
    tensors.push_back(tensor_from_floats("base_model.model." + module + ".lora_A.weight", DType::F32,
                                         {t.rank, t.in}, t.a));
    tensors.push_back(tensor_from_floats("base_model.model." + module + ".lora_B.weight", DType::F32,
                                         {t.out, t.rank}, t.b));
  }
  write_safetensors(dir / "adapter_model.safetensors", tensors);
  return written;
}

// `base_dir`'s F32 checkpoint with each module's W + scale * B A (its own rank and scale; in double, stored as F32)
// into `merged_dir`.
inline void write_merged_checkpoint(const ModelConfig& config, const SafetensorsArchive& base,
                                    const std::map<std::string, AdapterTensors>& adapter,
                                    const std::filesystem::path& merged_dir) {
  std::vector<TensorSource> tensors;
  for (const std::string& name : base.tensor_names()) {
    const TensorView& view = base.at(name);
    const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
    const auto found = adapter.find(module);
    if (found == adapter.end()) {
      tensors.push_back(tensor_from_bytes(name, view.dtype, view.shape, std::vector<std::byte>(view.data, view.data + view.nbytes)));
      continue;
    }
    EXPECT_EQ(view.dtype, DType::F32) << name;
    const AdapterTensors& t = found->second;
    std::vector<float> merged(static_cast<std::size_t>(t.out * t.in));
    for (int64_t o = 0; o < t.out; ++o)
      for (int64_t i = 0; i < t.in; ++i) {
        double delta = 0;
        for (int64_t r = 0; r < t.rank; ++r) delta += double{t.b[o * t.rank + r]} * double{t.a[r * t.in + i]};
        merged[o * t.in + i] = static_cast<float>(double{view.as<float>()[o * t.in + i]} + t.scale * delta);
      }
    tensors.push_back(tensor_from_floats(name, DType::F32, view.shape, merged));
  }
  write_model_files(config, merged_dir);
  write_safetensors_checkpoint(merged_dir, tensors);
}

// Attention of a dense and two MoE layers, the dense layer's MLP, and three experts of two MoE layers.
inline RandomAdapter everything_adapter(uint64_t seed) {
  RandomAdapter spec;
  spec.rank = 4;
  spec.alpha = 8.0;
  spec.seed = seed;
  spec.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  for (int layer : {0, 1, 3})
    for (const char* projection : {"q_proj", "k_proj", "v_proj", "o_proj"})
      spec.modules.push_back(fmt::format("model.layers.{}.self_attn.{}", layer, projection));
  for (const char* projection : {"gate_proj", "up_proj", "down_proj"}) {
    spec.modules.push_back(fmt::format("model.layers.0.mlp.{}", projection));
    for (int layer : {1, 2})
      for (int expert : {0, 3, 5})
        spec.modules.push_back(fmt::format("model.layers.{}.mlp.experts.{}.{}", layer, expert, projection));
  }
  return spec;
}

// An adapter as Megatron-Bridge's normalize_moe_lora trains one: attention at r = 8, experts at r / top_k = 4 (tiny
// routes top-2), one expert's gate at 3 and the dense MLP's gate at 6 (ranks differing per module), the dense down_proj
// with its own alpha; the config's rank_pattern / alpha_pattern say so.
inline RandomAdapter true_rank_adapter(uint64_t seed) {
  RandomAdapter spec = everything_adapter(seed);
  spec.rank = 8;
  spec.alpha = 16.0;
  for (const std::string& module : spec.modules)
    if (module.find(".experts.") != std::string::npos) spec.module_ranks[module] = 4;
  spec.module_ranks["model.layers.2.mlp.experts.5.gate_proj"] = 3;
  spec.module_ranks["model.layers.0.mlp.gate_proj"] = 6;
  spec.module_alphas["model.layers.0.mlp.down_proj"] = 5.0;
  return spec;
}

// The adapter_config.json keys that declare true_rank_adapter's ranks and alphas (PEFT's regular expressions).
inline const nlohmann::json kTrueRankPatterns = {
    {"rank_pattern",
     {{"layers\\.1\\.mlp\\.experts\\.\\d+\\.\\w+", 4},
      {"layers\\.2\\.mlp\\.experts\\.\\d+\\.(up|down)_proj", 4},
      {"layers\\.2\\.mlp\\.experts\\.[03]\\.gate_proj", 4},
      {"model.layers.2.mlp.experts.5.gate_proj", 3},
      {"layers.0.mlp.gate_proj", 6}}},
    {"alpha_pattern", {{"layers.0.mlp.down_proj", 5.0}}}};

// Logits of every position of `tokens` fed in two steps (a prompt chunk, then the last three one by one), through
// `model` with `slot`'s adapter (-1: none).
inline std::vector<float> lora_logits(BeamModel& model, const std::vector<int32_t>& tokens, int32_t slot) {
  const auto n = static_cast<int64_t>(tokens.size());
  SequenceRunner runner(model, n, n);
  runner.set_lora_slot(slot);
  std::vector<float> out = runner.step(std::span(tokens).first(static_cast<std::size_t>(n - 3)), true);
  for (int64_t i = n - 3; i < n; ++i) {
    const std::vector<float> step = runner.step(std::span(tokens).subspan(static_cast<std::size_t>(i), 1), true);
    out.insert(out.end(), step.begin(), step.end());
  }
  return out;
}

}  // namespace beamline::testing

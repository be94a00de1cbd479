#include "checkpoint/checkpoint_loader.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/quantize_tensors.h"
#include "checkpoint/random_init.h"
#include "checkpoint/safetensors.h"
#include "model/checkpoint_layout.h"
#include "util/error.h"

namespace beamline {
namespace {

bool is_float_dtype(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Finds each expected tensor, checks its shape and dtype, and remembers which archive tensors were used.
class WeightChecker {
 public:
  WeightChecker(const SafetensorsArchive& archive, const ModelConfig& config, std::filesystem::path dir)
      : archive_(archive), config_(config), dir_(std::move(dir)) {}

  LinearWeight check(const ExpectedTensor& expected) {
    switch (expected.role) {
      case TensorRole::Embedding:
      case TensorRole::Norm:
        return {fetch(expected.name, expected.shape, "BF16, F16 or F32", is_float_dtype)};
      case TensorRole::Router:
      case TensorRole::RouterBias:
        return {fetch(expected.name, expected.shape, "F32 (the router runs in FP32)",
                      [](DType dtype) { return dtype == DType::F32; })};
      case TensorRole::Projection:
        return check_projection(expected);
    }
    fail("unknown tensor role for \"{}\"", expected.name);
  }

  // vLLM's optional per-tensor KV cache scale `name` (self_attn.k_scale / v_scale): an F32 scalar (shape [] or [1]),
  // finite and > 0; nullopt when the checkpoint has none.
  std::optional<float> kv_scale(const std::string& name) {
    const TensorView* view = archive_.find(name);
    if (view == nullptr) return std::nullopt;
    used_.insert(name);
    const std::string file = archive_.file_of(name).string();
    if (!view->shape.empty() && view->shape != std::vector<int64_t>{1})
      fail("{}: tensor \"{}\": expected shape [] or [1] (a per-tensor KV cache scale), found {}", file, name,
           shape_string(view->shape));
    if (view->dtype != DType::F32)
      fail("{}: tensor \"{}\": dtype {} is not allowed here (expected F32)", file, name, dtype_name(view->dtype));
    float value = 0.0f;
    std::memcpy(&value, view->data, sizeof(value));
    if (!(std::isfinite(value) && value > 0.0f))
      fail("{}: tensor \"{}\": KV cache scale {} must be finite and > 0", file, name, value);
    return value;
  }

  std::vector<std::string> unused() const {
    std::vector<std::string> unused;
    for (const std::string& name : archive_.tensor_names())
      if (!used_.contains(name)) unused.push_back(name);
    return unused;
  }

  void warn_unused() const {
    const std::vector<std::string> unused = this->unused();
    if (unused.empty()) return;
    constexpr std::size_t kShown = 8;
    const std::vector<std::string> shown(unused.begin(), unused.begin() + std::min(unused.size(), kShown));
    spdlog::warn("{}: {} tensor(s) the model does not use, ignored: {}{}", dir_.string(), unused.size(),
                 fmt::join(shown, ", "), unused.size() > kShown ? ", ..." : "");
  }

 private:
  template <typename Allowed>
  TensorView fetch(const std::string& name, const std::vector<int64_t>& shape, std::string_view allowed_text,
                   Allowed allowed) {
    const TensorView* view = archive_.find(name);
    if (view == nullptr)
      fail("{}: tensor \"{}\" is missing (expected shape {}, dtype {})", dir_.string(), name, shape_string(shape),
           allowed_text);
    used_.insert(name);
    const std::string file = archive_.file_of(name).string();
    if (view->shape != shape)
      fail("{}: tensor \"{}\": expected shape {}, found {}", file, name, shape_string(shape), shape_string(view->shape));
    if (!allowed(view->dtype))
      fail("{}: tensor \"{}\": dtype {} is not allowed here (expected {})", file, name, dtype_name(view->dtype),
           allowed_text);
    return *view;
  }

  TensorView fetch_exact(const std::string& name, const std::vector<int64_t>& shape, DType dtype) {
    return fetch(name, shape, dtype_name(dtype), [dtype](DType found) { return found == dtype; });
  }

  bool ignored_by_quantization(std::string_view prefix) const {
    const auto& ignored = config_.quantization->ignored_layers;
    return std::any_of(ignored.begin(), ignored.end(),
                       [&](const std::string& entry) { return prefix.starts_with(entry); });
  }

  LinearWeight check_projection(const ExpectedTensor& expected) {
    const std::string& name = expected.name;
    const int64_t out = expected.shape[0], in = expected.shape[1];
    const TensorView* view = archive_.find(name);
    // Unquantized weights are always accepted: checkpoints commonly leave some projections (lm_head) in BF16.
    if (view == nullptr || is_float_dtype(view->dtype) || !config_.quantization)
      return {fetch(name, expected.shape, "BF16, F16 or F32", is_float_dtype)};

    const std::string file = archive_.file_of(name).string();
    const std::string prefix = name.substr(0, name.size() - std::string_view(".weight").size());
    const QuantizationConfig& quant = *config_.quantization;
    if (ignored_by_quantization(prefix))
      fail("{}: tensor \"{}\": dtype {} but quantization_config.ignored_layers leaves it unquantized "
           "(expected BF16, F16 or F32)", file, name, dtype_name(view->dtype));
    const auto require_divisible = [&](int64_t group) {
      if (in % group != 0)
        fail("{}: tensor \"{}\": {} quantization needs in_features ({}) divisible by {}", file, name,
             quant.quant_method, in, group);
    };

    LinearWeight weight;
    if (quant.quant_method == "fp8") {
      weight.weight = fetch_exact(name, expected.shape, DType::F8_E4M3);
      weight.scale = fetch_exact(prefix + ".weight_scale_inv",
                                 {ceil_div(out, quant.weight_block_size[0]), ceil_div(in, quant.weight_block_size[1])},
                                 DType::F32);
    } else if (quant.quant_method == "mxfp8") {
      require_divisible(32);
      weight.weight = fetch_exact(name, expected.shape, DType::F8_E4M3);
      weight.scale = fetch(prefix + ".weight_scale", {out, in / 32}, "U8 or F8_E8M0 (E8M0 exponents)",
                           [](DType dtype) { return dtype == DType::U8 || dtype == DType::F8_E8M0; });
    } else {  // modelopt NVFP4, the only other method ModelConfig accepts
      require_divisible(16);
      weight.weight = fetch(name, {out, in / 2}, "U8 (two packed E2M1 values per byte)",
                            [](DType dtype) { return dtype == DType::U8; });
      weight.scale = fetch_exact(prefix + ".weight_scale", {out, in / 16}, DType::F8_E4M3);
      weight.scale_2 = fetch_exact(prefix + ".weight_scale_2", {}, DType::F32);
    }
    return weight;
  }

  const SafetensorsArchive& archive_;
  const ModelConfig& config_;
  std::filesystem::path dir_;
  std::set<std::string, std::less<>> used_;
};

// Whether the archive holds the projections that `config` (quantized) quantizes as floats: its first such is.
bool holds_float_projections(const SafetensorsArchive& archive, const ModelConfig& config) {
  const std::vector<std::string>& ignored = config.quantization->ignored_layers;
  for (const ExpectedTensor& expected : expected_tensors(config)) {
    if (expected.role != TensorRole::Projection ||
        std::any_of(ignored.begin(), ignored.end(), [&](const std::string& prefix) { return expected.name.starts_with(prefix); }))
      continue;
    const TensorView* view = archive.find(expected.name);
    return view == nullptr || is_float_dtype(view->dtype);
  }
  return true;
}

// A float tensor as F32 (itself when it already is).
HostTensor widened_to_f32(const HostTensor& tensor) {
  const TensorView& view = tensor.view;
  if (view.dtype == DType::F32) return tensor;
  auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(view.numel()) * sizeof(float));
  auto* out = reinterpret_cast<float*>(bytes->data());
  const auto* in = view.as<uint16_t>();
  for (int64_t i = 0; i < view.numel(); ++i) out[i] = view.dtype == DType::BF16 ? bf16_to_f32(in[i]) : f16_to_f32(in[i]);
  return {TensorView{view.name, DType::F32, view.shape, bytes->data(), bytes->size()}, std::move(bytes)};
}

// Puts the checked tensors, by name, into the per-layer structure.
void assemble(BeamWeights& weights, const std::map<std::string, LinearWeight, std::less<>>& checked) {
  const ModelConfig& config = weights.config;
  const auto take = [&](const std::string& name) -> const LinearWeight& { return checked.at(name); };
  weights.embed_tokens = take("model.embed_tokens.weight").weight;
  weights.norm = take("model.norm.weight").weight;
  weights.lm_head = config.tie_word_embeddings ? LinearWeight{weights.embed_tokens} : take("lm_head.weight");
  weights.layers.resize(static_cast<std::size_t>(config.num_hidden_layers));
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    LayerWeights& layer = weights.layers[static_cast<std::size_t>(i)];
    const auto in_layer = [&](std::string_view suffix) -> const LinearWeight& { return take(layer_tensor_name(i, suffix)); };
    layer.input_layernorm = in_layer("input_layernorm.weight").weight;
    layer.post_attention_layernorm = in_layer("post_attention_layernorm.weight").weight;
    layer.pre_feedforward_layernorm = in_layer("pre_feedforward_layernorm.weight").weight;
    layer.post_feedforward_layernorm = in_layer("post_feedforward_layernorm.weight").weight;
    layer.q_proj = in_layer("self_attn.q_proj.weight");
    layer.k_proj = in_layer("self_attn.k_proj.weight");
    layer.v_proj = in_layer("self_attn.v_proj.weight");
    layer.o_proj = in_layer("self_attn.o_proj.weight");
    if (!config.is_moe_layer(i)) {
      layer.mlp = ExpertWeights{in_layer("mlp.gate_proj.weight"), in_layer("mlp.up_proj.weight"),
                                in_layer("mlp.down_proj.weight")};
      continue;
    }
    layer.router = in_layer("mlp.gate.weight").weight;
    layer.router_bias = in_layer("mlp.gate.e_score_correction_bias").weight;
    layer.experts.reserve(static_cast<std::size_t>(config.n_routed_experts));
    for (int64_t e = 0; e < config.n_routed_experts; ++e)
      layer.experts.push_back(ExpertWeights{take(expert_tensor_name(i, e, "gate_proj")),
                                            take(expert_tensor_name(i, e, "up_proj")),
                                            take(expert_tensor_name(i, e, "down_proj"))});
  }
}

// Each layer's optional KV cache scales (vLLM's names), checked.
void read_kv_scales(BeamWeights& weights, WeightChecker& checker) {
  for (std::size_t i = 0; i < weights.layers.size(); ++i) {
    LayerWeights& layer = weights.layers[i];
    layer.k_scale = checker.kv_scale(layer_tensor_name(static_cast<int64_t>(i), "self_attn.k_scale"));
    layer.v_scale = checker.kv_scale(layer_tensor_name(static_cast<int64_t>(i), "self_attn.v_scale"));
  }
}

}  // namespace

BeamWeights load_checkpoint(const std::filesystem::path& dir) {
  BeamWeights weights;
  weights.config = ModelConfig::load(dir / "config.json");
  weights.archive = SafetensorsArchive::open(dir);
  const ModelConfig& config = weights.config;

  WeightChecker checker(*weights.archive, config, dir);
  std::map<std::string, LinearWeight, std::less<>> checked;
  for (const ExpectedTensor& expected : expected_tensors(config)) checked.emplace(expected.name, checker.check(expected));
  assemble(weights, checked);
  read_kv_scales(weights, checker);
  checker.warn_unused();
  return weights;
}

BeamWeights load_weight_update(const std::filesystem::path& dir, const ModelConfig& served) {
  BeamWeights weights;
  weights.archive = SafetensorsArchive::open(dir);
  // A server quantized at load (--quantization) takes float checkpoints, quantized here as at load.
  weights.config = served;
  if (served.quantization && holds_float_projections(*weights.archive, served)) weights.config.quantization.reset();
  if (std::filesystem::exists(dir / "config.json")) {
    const ModelConfig config = ModelConfig::load(dir / "config.json");
    require(config.to_json() == weights.config.to_json(),
            "{}: config.json describes another model than the one served (the architecture cannot change{})",
            (dir / "config.json").string(),
            served.quantization ? fmt::format("; served quantized as {}, it may hold float or {} weights",
                                              served.quantization->quant_method, served.quantization->quant_method)
                                : "");
  }
  WeightChecker checker(*weights.archive, weights.config, dir);
  std::map<std::string, LinearWeight, std::less<>> checked;
  for (const ExpectedTensor& expected : expected_tensors(weights.config))
    checked.emplace(expected.name, checker.check(expected));
  assemble(weights, checked);
  read_kv_scales(weights, checker);
  const std::vector<std::string> unknown = checker.unused();
  if (!unknown.empty()) {
    fail("{}: tensor \"{}\" is not a tensor of this model ({} unknown tensor(s))",
         weights.archive->file_of(unknown.front()).string(), unknown.front(), unknown.size());
  }
  if (served.quantization && !weights.config.quantization) return quantize_weights(std::move(weights), *served.quantization);
  return weights;
}

BeamWeights with_received_tensors(const BeamWeights& served, std::span<const HostTensor> received,
                                  const std::function<bool(std::string_view)>& apply) {
  std::map<std::string, ExpectedTensor, std::less<>> expected;
  for (ExpectedTensor& tensor : expected_tensors(served.config)) expected.emplace(tensor.name, std::move(tensor));
  BeamWeights weights = served;
  // The views each name replaces (the embeddings twice when the LM head is tied to them). `weights` is this
  // function's own copy, so its views may be written through views()' pointers.
  std::map<std::string, std::vector<TensorView*>, std::less<>> targets;
  for (const TensorView* view : weights.views()) targets[view->name].push_back(const_cast<TensorView*>(view));
  std::set<std::string, std::less<>> seen;
  std::vector<TensorView> to_quantize;
  for (const HostTensor& tensor : received) {
    const TensorView& view = tensor.view;
    const auto found = expected.find(view.name);
    require(found != expected.end(), "tensor \"{}\" is not a tensor of this model", view.name);
    require(seen.insert(view.name).second, "tensor \"{}\" is sent twice", view.name);
    const ExpectedTensor& wanted = found->second;
    require(view.shape == wanted.shape, "tensor \"{}\": expected shape {}, got {}", view.name,
            shape_string(wanted.shape), shape_string(view.shape));
    require(is_float_dtype(view.dtype), "tensor \"{}\": dtype {} is not allowed here (expected BF16, F16 or F32)",
            view.name, dtype_name(view.dtype));
    require(view.data != nullptr && view.nbytes == static_cast<std::size_t>(view.numel()) * dtype_size(view.dtype),
            "tensor \"{}\": {} bytes for {} {} elements", view.name, view.nbytes, view.numel(), dtype_name(view.dtype));
    const auto served_views = targets.find(view.name);
    require(served_views != targets.end(), "tensor \"{}\": the served model holds no such tensor", view.name);
    if (apply && !apply(view.name)) continue;
    // A projection served quantized (FP8, MXFP8, NVFP4) is quantized on arrival, below.
    if (!is_float_dtype(served_views->second.front()->dtype)) {
      to_quantize.push_back(view);
      continue;
    }
    const bool router = wanted.role == TensorRole::Router || wanted.role == TensorRole::RouterBias;
    // The router runs in FP32 whatever the trainer holds it in; widening BF16/F16 is exact.
    const HostTensor stored = router ? widened_to_f32(tensor) : tensor;
    for (TensorView* target : served_views->second) *target = stored.view;
    weights.slice_buffers.push_back(stored.bytes);
  }
  weights = with_quantized_projections(std::move(weights), to_quantize);
  // The bytes of earlier updates whose tensors have all been replaced since are let go.
  std::vector<const std::byte*> in_use;
  for (const TensorView* view : weights.views()) in_use.push_back(view->data);
  std::sort(in_use.begin(), in_use.end());
  std::erase_if(weights.slice_buffers, [&](const std::shared_ptr<const std::vector<std::byte>>& buffer) {
    const auto first = std::lower_bound(in_use.begin(), in_use.end(), buffer->data());
    return first == in_use.end() || *first >= buffer->data() + buffer->size();
  });
  return weights;
}

BeamWeights dummy_weights(const ModelConfig& config, uint64_t seed, DType dtype) {
  BeamWeights weights;
  weights.config = config;
  weights.random_seed = seed;
  std::map<std::string, LinearWeight, std::less<>> views;
  for (const ExpectedTensor& expected : expected_tensors(config)) {
    const RandomInit init = random_init(expected, dtype);
    TensorView view{expected.name, init.dtype, expected.shape, nullptr, 0};
    view.nbytes = static_cast<std::size_t>(view.numel()) * dtype_size(init.dtype);
    weights.random_inits.emplace(expected.name, init);
    views.emplace(expected.name, LinearWeight{std::move(view), {}, {}});
  }
  assemble(weights, views);
  return weights;
}

}  // namespace beamline

#include "checkpoint/drafter_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"
#include "util/json_fields.h"

namespace beamline {
namespace {

namespace jf = json_fields;

int64_t positive(const nlohmann::json& object, std::string_view key, const jf::Location& where) {
  const int64_t value = jf::as_integer(jf::required(object, key, where), where.key(key));
  if (value < 1) jf::fail_at(where.key(key), fmt::format("must be at least 1 (got {})", value));
  return value;
}

}  // namespace

DrafterConfig DrafterConfig::load(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: invalid JSON: {}", path.string(), error.what());
  }
  const jf::Location root(path.string(), "");
  jf::expect_object(json, root);
  const std::vector<std::string> architectures =
      jf::string_array(jf::required(json, "architectures", root), root.key("architectures"));
  if (std::find(architectures.begin(), architectures.end(), "BeamDrafter") == architectures.end())
    jf::fail_at(root.key("architectures"), "must name \"BeamDrafter\" (this is not a block drafter's config)");
  DrafterConfig c;
  c.hidden_size = positive(json, "hidden_size", root);
  c.num_hidden_layers = positive(json, "num_hidden_layers", root);
  c.num_attention_heads = positive(json, "num_attention_heads", root);
  c.num_key_value_heads = positive(json, "num_key_value_heads", root);
  c.head_dim = jf::find(json, "head_dim") ? positive(json, "head_dim", root) : c.hidden_size / c.num_attention_heads;
  c.intermediate_size = positive(json, "intermediate_size", root);
  c.sliding_window = positive(json, "sliding_window", root);
  c.rope_theta = jf::optional_number(json, "rope_theta", root).value_or(c.rope_theta);
  c.rms_norm_eps = jf::optional_number(json, "rms_norm_eps", root);
  c.residual_scale = jf::optional_number(json, "residual_scale", root);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    jf::fail_at(root.key("num_key_value_heads"),
                fmt::format("{} does not divide num_attention_heads {}", c.num_key_value_heads, c.num_attention_heads));
  const jf::Location dflash = root.key("dflash_config");
  const nlohmann::json& block = jf::required(json, "dflash_config", root);
  jf::expect_object(block, dflash);
  c.target_layer_ids = jf::integer_array(jf::required(block, "target_layer_ids", dflash), dflash.key("target_layer_ids"));
  if (c.target_layer_ids.empty()) jf::fail_at(dflash.key("target_layer_ids"), "must name at least one target layer");
  c.block_size = positive(block, "block_size", dflash);
  if (c.block_size < 2) jf::fail_at(dflash.key("block_size"), "must be at least 2 (an anchor and one draft token)");
  c.mask_token_id = jf::as_integer(jf::required(block, "mask_token_id", dflash), dflash.key("mask_token_id"));
  return c;
}

nlohmann::json DrafterConfig::to_json() const {
  nlohmann::json json{{"architectures", {"BeamDrafter"}},
                      {"hidden_size", hidden_size},
                      {"num_hidden_layers", num_hidden_layers},
                      {"num_attention_heads", num_attention_heads},
                      {"num_key_value_heads", num_key_value_heads},
                      {"head_dim", head_dim},
                      {"intermediate_size", intermediate_size},
                      {"sliding_window", sliding_window},
                      {"rope_theta", rope_theta},
                      {"dflash_config",
                       {{"target_layer_ids", target_layer_ids}, {"block_size", block_size},
                        {"mask_token_id", mask_token_id}}}};
  if (rms_norm_eps) json["rms_norm_eps"] = *rms_norm_eps;
  if (residual_scale) json["residual_scale"] = *residual_scale;
  return json;
}

DrafterConfig random_drafter_config(const ModelConfig& target) {
  DrafterConfig c;
  c.hidden_size = target.hidden_size;
  c.num_hidden_layers = 2;
  c.num_attention_heads = target.num_attention_heads;
  c.num_key_value_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.intermediate_size = target.intermediate_size;
  c.sliding_window = 64;
  c.rope_theta = target.rope_theta;
  const int64_t last = target.num_hidden_layers - 1;
  c.target_layer_ids = {0, last / 2, last};
  c.target_layer_ids.erase(std::unique(c.target_layer_ids.begin(), c.target_layer_ids.end()), c.target_layer_ids.end());
  c.block_size = 8;
  c.mask_token_id = target.vocab_size - 1;
  return c;
}

std::vector<ExpectedTensor> expected_drafter_tensors(const DrafterConfig& c) {
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  const int64_t q_width = c.num_attention_heads * c.head_dim, kv_width = c.num_key_value_heads * c.head_dim;
  const auto features = static_cast<int64_t>(c.target_layer_ids.size()) * H;
  std::vector<ExpectedTensor> tensors{{"fc.weight", TensorRole::Projection, {H, features}},
                                      {"hidden_norm.weight", TensorRole::Norm, {H}}};
  for (int64_t j = 0; j < c.num_hidden_layers; ++j) {
    const auto add = [&](std::string_view suffix, TensorRole role, std::vector<int64_t> shape) {
      tensors.push_back({fmt::format("layers.{}.{}", j, suffix), role, std::move(shape)});
    };
    add("input_layernorm.weight", TensorRole::Norm, {H});
    add("self_attn.q_proj.weight", TensorRole::Projection, {q_width, H});
    add("self_attn.k_proj.weight", TensorRole::Projection, {kv_width, H});
    add("self_attn.v_proj.weight", TensorRole::Projection, {kv_width, H});
    add("self_attn.o_proj.weight", TensorRole::Projection, {H, q_width});
    add("post_attention_layernorm.weight", TensorRole::Norm, {H});
    add("pre_feedforward_layernorm.weight", TensorRole::Norm, {H});
    add("post_feedforward_layernorm.weight", TensorRole::Norm, {H});
    add("mlp.gate_proj.weight", TensorRole::Projection, {F, H});
    add("mlp.up_proj.weight", TensorRole::Projection, {F, H});
    add("mlp.down_proj.weight", TensorRole::Projection, {H, F});
  }
  return tensors;
}

void check_drafter_fits(const DrafterConfig& drafter, const ModelConfig& target, int32_t num_speculative_tokens,
                        const std::filesystem::path& dir) {
  const std::string file = (dir / "config.json").string();
  require(drafter.hidden_size == target.hidden_size,
          "{}: key \"hidden_size\": {} differs from the target's hidden_size {} (the drafter reads the target's hidden "
          "states and shares its embeddings)",
          file, drafter.hidden_size, target.hidden_size);
  for (std::size_t i = 0; i < drafter.target_layer_ids.size(); ++i) {
    const int64_t layer = drafter.target_layer_ids[i];
    require(layer >= 0 && layer < target.num_hidden_layers,
            "{}: key \"dflash_config.target_layer_ids[{}]\": layer {} is not a layer of the target (it has {})", file, i,
            layer, target.num_hidden_layers);
  }
  require(drafter.mask_token_id >= 0 && drafter.mask_token_id < target.vocab_size,
          "{}: key \"dflash_config.mask_token_id\": {} is outside the target's vocabulary [0, {})", file,
          drafter.mask_token_id, target.vocab_size);
  require(num_speculative_tokens <= drafter.block_size - 1,
          "--speculative-config: \"num_speculative_tokens\" {} exceeds what one drafter pass proposes "
          "(dflash_config.block_size - 1 = {} in {})",
          num_speculative_tokens, drafter.block_size - 1, file);
}

DrafterCheckpoint load_drafter_checkpoint(const std::filesystem::path& dir, const ModelConfig& target,
                                          int32_t num_speculative_tokens) {
  DrafterCheckpoint drafter;
  drafter.config = DrafterConfig::load(dir);
  check_drafter_fits(drafter.config, target, num_speculative_tokens, dir);
  drafter.archive = SafetensorsArchive::open(dir);
  std::set<std::string> expected_names;
  for (const ExpectedTensor& expected : expected_drafter_tensors(drafter.config)) {
    expected_names.insert(expected.name);
    const TensorView* view = drafter.archive->find(expected.name);
    if (view == nullptr)
      fail("{}: drafter tensor \"{}\" is missing (expected shape {})", dir.string(), expected.name,
           shape_string(expected.shape));
    if (view->shape != expected.shape)
      fail("{}: drafter tensor \"{}\": expected shape {}, found {}", drafter.archive->file_of(expected.name).string(),
           expected.name, shape_string(expected.shape), shape_string(view->shape));
    if (view->dtype != DType::BF16 && view->dtype != DType::F16 && view->dtype != DType::F32)
      fail("{}: drafter tensor \"{}\": dtype {} is not allowed (expected BF16, F16 or F32)",
           drafter.archive->file_of(expected.name).string(), expected.name, dtype_name(view->dtype));
  }
  for (const std::string& name : drafter.archive->tensor_names()) {
    require(expected_names.contains(name),
            "{}: tensor \"{}\" is not a drafter tensor (the drafter shares the target's embed_tokens, norm and lm_head; "
            "its config implies {} layers)",
            dir.string(), name, drafter.config.num_hidden_layers);
  }
  return drafter;
}

}  // namespace beamline

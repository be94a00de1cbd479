// config.json parsing: every accepted form, and every rejection naming its key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "checkpoint/presets.h"
#include "model/config.h"
#include "util/error.h"

namespace beamline {
namespace {

using nlohmann::json;

json tiny_json() { return preset_config("tiny").to_json(); }

std::string rejection(const json& document) {
  try {
    ModelConfig::from_json(document, "config.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// The message must say "config.json: key "<key>"" and contain `reason`.
void expect_rejected(const json& document, const std::string& key, const std::string& reason) {
  const std::string message = rejection(document);
  ASSERT_FALSE(message.empty()) << "accepted a config that should fail on key " << key;
  EXPECT_NE(message.find("config.json: key \"" + key + "\""), std::string::npos) << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;
}

TEST(Config, PresetRoundTripsThroughJson) {
  for (const std::string& name : preset_names()) {
    const ModelConfig original = preset_config(name);
    const ModelConfig parsed = ModelConfig::from_json(original.to_json());
    EXPECT_EQ(parsed.to_json(), original.to_json()) << name;
    EXPECT_EQ(parsed.layer_types, original.layer_types);
    EXPECT_EQ(parsed.eos_token_ids, original.eos_token_ids);
  }
}

TEST(Config, Beam10HasTheDocumentedShape) {
  const ModelConfig c = ModelConfig::from_json(preset_config("beam-1.0").to_json());
  EXPECT_EQ(c.vocab_size, 201088);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_hidden_layers, 52);
  EXPECT_EQ(c.kv_group_size(), 6);
  int full = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool expect_full = i % 6 == 5 || i == 51;
    EXPECT_EQ(c.layer_types[i], expect_full ? LayerType::Full : LayerType::Sliding) << i;
    full += expect_full;
  }
  EXPECT_EQ(full, 9);
  EXPECT_DOUBLE_EQ(c.residual_scale, 1.0 / std::sqrt(104.0));
}

TEST(Config, LayerTypesDerivedWhenAbsent) {
  json document = tiny_json();
  document.erase("layer_types");
  ModelConfig c = ModelConfig::from_json(document);
  EXPECT_EQ(c.layer_types, std::vector<LayerType>({LayerType::Sliding, LayerType::Sliding, LayerType::Sliding,
                                                   LayerType::Sliding, LayerType::Sliding, LayerType::Full}));
  document["global_attention_every"] = 2;
  document["num_hidden_layers"] = 5;
  document["first_k_dense_replace"] = 1;
  c = ModelConfig::from_json(document);
  EXPECT_EQ(c.layer_types, std::vector<LayerType>({LayerType::Sliding, LayerType::Full, LayerType::Sliding,
                                                   LayerType::Full, LayerType::Full}));
  EXPECT_EQ(default_layer_types(13, 6).size(), 13u);
}

TEST(Config, DefaultsForOptionalKeys) {
  json document = tiny_json();
  for (const char* key : {"residual_scale", "norm_topk_prob", "scoring_func", "topk_method", "ssmax_base",
                          "ssmax_exponent", "rms_norm_eps", "final_logit_softcapping", "tie_word_embeddings",
                          "architectures", "bos_token_id", "pad_token_id", "eos_token_id"})
    document.erase(key);
  const ModelConfig c = ModelConfig::from_json(document);
  EXPECT_DOUBLE_EQ(c.residual_scale, 1.0 / std::sqrt(12.0));
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_DOUBLE_EQ(c.ssmax_base, 2048.0);
  EXPECT_DOUBLE_EQ(c.ssmax_exponent, 0.1);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.quantization.has_value());
}

TEST(Config, EosTokenIdIntOrList) {
  json document = tiny_json();
  document["eos_token_id"] = 7;
  EXPECT_EQ(ModelConfig::from_json(document).eos_token_ids, std::vector<int64_t>{7});
  document["eos_token_id"] = {3, 9, 11};
  EXPECT_EQ(ModelConfig::from_json(document).eos_token_ids, (std::vector<int64_t>{3, 9, 11}));
  EXPECT_EQ(ModelConfig::from_json(document).to_json()["eos_token_id"], json({3, 9, 11}));
  document["eos_token_id"] = nullptr;
  EXPECT_TRUE(ModelConfig::from_json(document).eos_token_ids.empty());
}

TEST(Config, QuantizationConfigs) {
  json document = tiny_json();
  document["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  ModelConfig c = ModelConfig::from_json(document);
  ASSERT_TRUE(c.quantization);
  EXPECT_EQ(c.quantization->quant_method, "fp8");
  EXPECT_EQ(c.quantization->weight_block_size, (std::vector<int64_t>{128, 128}));

  document["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"ignored_layers", {"lm_head"}}};
  c = ModelConfig::from_json(document);
  EXPECT_EQ(c.quantization->weight_block_size, (std::vector<int64_t>{128, 128}));
  // What vLLM's Fp8Config reads back.
  EXPECT_EQ(c.to_json()["quantization_config"]["activation_scheme"], "dynamic");
  EXPECT_EQ(c.to_json()["quantization_config"]["ignored_layers"], json({"lm_head"}));
  EXPECT_EQ(c.quantization->ignored_layers, std::vector<std::string>{"lm_head"});
  EXPECT_EQ(ModelConfig::from_json(c.to_json()).to_json(), c.to_json());

  document["quantization_config"] = {{"quant_method", "mxfp8"}, {"modules_to_not_convert", {"lm_head", "model.layers.0"}}};
  c = ModelConfig::from_json(document);
  EXPECT_EQ(c.quantization->ignored_layers, (std::vector<std::string>{"lm_head", "model.layers.0"}));

  document["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}};
  c = ModelConfig::from_json(document);
  EXPECT_EQ(c.quantization->quant_algo, "NVFP4");
}

TEST(Config, MissingRequiredKeysAreNamed) {
  for (const char* key : {"model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
                          "first_k_dense_replace", "n_routed_experts", "num_experts_per_tok", "n_group",
                          "topk_group", "routed_scaling_factor", "sliding_window", "rope_theta",
                          "max_position_embeddings"}) {
    json document = tiny_json();
    document.erase(key);
    expect_rejected(document, key, "required key is missing");
    document[key] = nullptr;
    expect_rejected(document, key, "required key is missing");
  }
}

TEST(Config, WrongTypesAreNamed) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"vocab_size", "512"},          {"hidden_size", 64.5},           {"num_hidden_layers", true},
      {"head_dim", json::array()},    {"rope_theta", "10000"},         {"routed_scaling_factor", json::object()},
      {"norm_topk_prob", 1},          {"tie_word_embeddings", "false"}, {"model_type", 5},
      {"architectures", "Beam"},      {"layer_types", "sliding_attention"}, {"scoring_func", false},
      {"bos_token_id", 1.5},          {"eos_token_id", "x"},           {"rms_norm_eps", "1e-6"},
      {"quantization_config", "fp8"}, {"residual_scale", "0.3"},       {"global_attention_every", 2.0},
  };
  for (const auto& [key, value] : cases) {
    json document = tiny_json();
    if (key == "global_attention_every") document.erase("layer_types");
    document[key] = value;
    const std::string message = rejection(document);
    ASSERT_FALSE(message.empty()) << key;
    EXPECT_NE(message.find("\"" + key), std::string::npos) << message;
    EXPECT_NE(message.find("must be"), std::string::npos) << message;
  }
  json document = tiny_json();
  document["architectures"] = {"BeamForCausalLM", 3};
  expect_rejected(document, "architectures[1]", "must be a string");
  document = tiny_json();
  document["eos_token_id"] = {1, "two"};
  expect_rejected(document, "eos_token_id[1]", "must be an integer");
  EXPECT_NE(rejection(json::array()).find("config.json: must be a JSON object"), std::string::npos);
}

TEST(Config, InconsistentValuesAreNamed) {
  const auto with = [](std::initializer_list<std::pair<const char*, json>> changes) {
    json document = tiny_json();
    for (const auto& [key, value] : changes) document[key] = value;
    return document;
  };
  EXPECT_EQ(rejection(with({{"n_group", 3}})), "config.json: key \"n_group\": 3 does not divide n_routed_experts (8)");
  expect_rejected(with({{"num_key_value_heads", 3}}), "num_key_value_heads", "does not divide num_attention_heads (4)");
  expect_rejected(with({{"topk_group", 5}}), "topk_group", "larger than n_group (4)");
  expect_rejected(with({{"num_experts_per_tok", 5}}), "num_experts_per_tok", "more than the 4 experts");
  expect_rejected(with({{"n_group", 8}, {"topk_group", 2}}), "n_group", "at least 2");
  expect_rejected(with({{"first_k_dense_replace", 7}}), "first_k_dense_replace", "outside [0, num_hidden_layers = 6]");
  expect_rejected(with({{"first_k_dense_replace", -1}}), "first_k_dense_replace", "outside");
  expect_rejected(with({{"sliding_window", 0}}), "sliding_window", "must be positive");
  expect_rejected(with({{"head_dim", 0}}), "head_dim", "must be positive");
  expect_rejected(with({{"head_dim", 15}}), "head_dim", "odd");
  expect_rejected(with({{"vocab_size", -4}}), "vocab_size", "must be positive");
  expect_rejected(with({{"num_attention_heads", 0}}), "num_attention_heads", "must be positive");
  expect_rejected(with({{"rope_theta", 0.0}}), "rope_theta", "must be positive");
  expect_rejected(with({{"routed_scaling_factor", -2.5}}), "routed_scaling_factor", "must be positive");
  expect_rejected(with({{"rms_norm_eps", 0}}), "rms_norm_eps", "must be positive");
  expect_rejected(with({{"model_type", "llama"}}), "model_type", "is not \"beam\"");
  expect_rejected(with({{"scoring_func", "softmax"}}), "scoring_func", "only \"sigmoid\"");
  expect_rejected(with({{"topk_method", "greedy"}}), "topk_method", "only \"noaux_tc\"");
  expect_rejected(with({{"bos_token_id", 512}}), "bos_token_id", "outside the vocabulary [0, 512)");
  expect_rejected(with({{"eos_token_id", {1, 600}}}), "eos_token_id[1]", "outside the vocabulary");
  expect_rejected(with({{"vocab_size", 18446744073709551615ull}}), "vocab_size", "out of range");
  expect_rejected(with({{"layer_types", {"sliding_attention"}}}), "layer_types", "has 1 entries but num_hidden_layers is 6");
  json bad_type = tiny_json();
  bad_type["layer_types"][3] = "global";
  expect_rejected(bad_type, "layer_types[3]", "\"global\" is not \"sliding_attention\" or \"full_attention\"");
  json bad_every = tiny_json();
  bad_every.erase("layer_types");
  bad_every["global_attention_every"] = 0;
  expect_rejected(bad_every, "global_attention_every", "must be positive");
}

TEST(Config, QuantizationRejectionsAreNamed) {
  const auto with_quant = [](json quant) {
    json document = tiny_json();
    document["quantization_config"] = std::move(quant);
    return document;
  };
  expect_rejected(with_quant({{"quant_method", "int4"}}), "quantization_config.quant_method", "\"int4\" is not one of");
  expect_rejected(with_quant({{"bits", 4}}), "quantization_config.quant_method", "required key is missing");
  expect_rejected(with_quant({{"quant_method", "modelopt"}}), "quantization_config.quant_algo", "missing");
  expect_rejected(with_quant({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}}), "quantization_config.quant_algo",
                  "only \"NVFP4\"");
  expect_rejected(with_quant({{"quant_method", "fp8"}, {"weight_block_size", {128}}}),
                  "quantization_config.weight_block_size", "must be [128, 128]");
  expect_rejected(with_quant({{"quant_method", "fp8"}, {"weight_block_size", {128, 0}}}),
                  "quantization_config.weight_block_size", "must be [128, 128]");
  expect_rejected(with_quant({{"quant_method", "fp8"}, {"weight_block_size", {64, 32}}}),
                  "quantization_config.weight_block_size", "found [64,32]");
  expect_rejected(with_quant({{"quant_method", "mxfp8"}, {"ignored_layers", {"lm_head", 3}}}),
                  "quantization_config.ignored_layers[1]", "must be a string");
}

// Random single-key corruptions never crash and, when rejected, name a key that exists in the message.
TEST(Config, RandomCorruptionsAreRejectedCleanly) {
  std::mt19937_64 rng(1234);
  const json base = tiny_json();
  std::vector<std::string> keys;
  for (const auto& [key, value] : base.items()) keys.push_back(key);
  const std::vector<json> replacements = {nullptr, -1, 0, 1, 3, 1 << 30, 0.5, -7.25, "text", true, json::array(),
                                          json::object(), {1, 2}};
  for (int trial = 0; trial < 500; ++trial) {
    json document = base;
    const std::string& key = keys[rng() % keys.size()];
    document[key] = replacements[rng() % replacements.size()];
    try {
      const ModelConfig c = ModelConfig::from_json(document);
      EXPECT_EQ(c.layer_types.size(), static_cast<std::size_t>(c.num_hidden_layers));
      EXPECT_EQ(c.num_attention_heads % c.num_key_value_heads, 0);
      EXPECT_EQ(c.n_routed_experts % c.n_group, 0);
      EXPECT_LE(c.topk_group, c.n_group);
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("config.json: key \""), std::string::npos) << error.what();
    }
  }
}

TEST(Config, LoadNamesThePath) {
  const auto dir = std::filesystem::temp_directory_path() / ("beamline_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "config.json";
  {
    std::ofstream(path) << "{\"model_type\": \"beam\", ";
  }
  try {
    ModelConfig::load(path);
    FAIL() << "truncated JSON accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(path.string() + ": invalid JSON"), std::string::npos) << error.what();
  }
  {
    std::ofstream(path) << tiny_json().dump() << "\n";
  }
  EXPECT_EQ(ModelConfig::load(path).hidden_size, 64);
  {
    json document = tiny_json();
    document["n_group"] = 3;
    std::ofstream(path) << document.dump();
  }
  try {
    ModelConfig::load(path);
    FAIL() << "bad n_group accepted";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), path.string() + ": key \"n_group\": 3 does not divide n_routed_experts (8)");
  }
  try {
    ModelConfig::load(dir / "absent.json");
    FAIL() << "missing file accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("absent.json: cannot open: No such file"), std::string::npos) << error.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Config, WithNumLayersKeepsTheRules) {
  const ModelConfig beam = preset_config("beam-1.0");
  ModelConfig four = with_num_layers(beam, 4);
  EXPECT_EQ(four.first_k_dense_replace, 3);
  EXPECT_EQ(four.layer_types, std::vector<LayerType>({LayerType::Sliding, LayerType::Sliding, LayerType::Sliding, LayerType::Full}));
  EXPECT_DOUBLE_EQ(four.residual_scale, 1.0 / std::sqrt(8.0));
  ModelConfig::from_json(four.to_json());
  const ModelConfig twelve = with_num_layers(beam, 12);
  EXPECT_EQ(twelve.layer_types[5], LayerType::Full);
  EXPECT_EQ(twelve.layer_types[11], LayerType::Full);
  EXPECT_EQ(twelve.layer_types[10], LayerType::Sliding);
  const ModelConfig two = with_num_layers(beam, 2);
  EXPECT_EQ(two.first_k_dense_replace, 1);
  const ModelConfig tiny_three = with_num_layers(preset_config("tiny"), 3);
  EXPECT_EQ(tiny_three.layer_types, std::vector<LayerType>({LayerType::Sliding, LayerType::Sliding, LayerType::Full}));
  EXPECT_THROW(with_num_layers(beam, 0), Error);
}

}  // namespace
}  // namespace beamline

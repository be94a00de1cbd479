// load_checkpoint: a good checkpoint gives the per-layer structure; every missing, mis-shaped or
// wrongly typed tensor gives an error naming the file, the tensor and what was expected; quantized layouts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "checkpoint/safetensors.h"
#include "model/checkpoint_layout.h"
#include "model/weights.h"
#include "util/error.h"

namespace beamline {
namespace {

namespace fs = std::filesystem;

// Random bytes below 0x80 keep FP8 codes finite.
TensorSource random_bytes_tensor(std::string name, DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  std::vector<std::byte> bytes(static_cast<std::size_t>(numel) * dtype_size(dtype));
  for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0x7f);  // keeps FP8 codes finite
  return tensor_from_bytes(std::move(name), dtype, std::move(shape), std::move(bytes));
}


class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("beamline_w_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A checkpoint of `config` whose tensors are `tensors` (random ones by default).
  void write_checkpoint(const ModelConfig& config, const std::vector<TensorSource>& tensors,
                        uint64_t max_shard_bytes = kDefaultMaxShardBytes) {
    write_text_file(dir_ / "config.json", config.to_json().dump());
    write_safetensors_checkpoint(dir_, tensors, max_shard_bytes);
  }

  std::string load_error() {
    try {
      load_checkpoint(dir_);
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  }

  void expect_load_error(const std::vector<std::string>& fragments) {
    const std::string message = load_error();
    ASSERT_FALSE(message.empty()) << "the checkpoint loaded";
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "missing \"" << fragment << "\" in: " << message;
  }

  static std::vector<TensorSource> without(std::vector<TensorSource> tensors, const std::string& name) {
    std::erase_if(tensors, [&](const TensorSource& t) { return t.name == name; });
    return tensors;
  }
  static TensorSource& find(std::vector<TensorSource>& tensors, const std::string& name) {
    for (TensorSource& tensor : tensors)
      if (tensor.name == name) return tensor;
    throw std::runtime_error("test bug: no tensor " + name);
  }
  fs::path dir_;
  ModelConfig tiny_ = preset_config("tiny");
};

TEST_F(WeightsTest, TinyCheckpointLoadsWithTheRightStructure) {
  write_random_checkpoint(tiny_, dir_, 3, DType::BF16);
  const BeamWeights weights = load_checkpoint(dir_);
  const ModelConfig& c = weights.config;
  EXPECT_EQ(c.to_json(), tiny_.to_json());
  ASSERT_EQ(weights.layers.size(), 6u);
  EXPECT_EQ(weights.embed_tokens.shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(weights.lm_head.weight.name, "lm_head.weight");
  EXPECT_FALSE(weights.lm_head.quantized());
  EXPECT_EQ(weights.norm.name, "model.norm.weight");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& layer = weights.layers[static_cast<std::size_t>(i)];
    EXPECT_EQ(layer.q_proj.weight.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(layer.k_proj.weight.shape, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(layer.o_proj.weight.name, fmt::format("model.layers.{}.self_attn.o_proj.weight", i));
    EXPECT_EQ(layer.post_feedforward_layernorm.name, fmt::format("model.layers.{}.post_feedforward_layernorm.weight", i));
    EXPECT_EQ(layer.q_proj.weight.dtype, DType::BF16);
    if (i < 1) {
      ASSERT_TRUE(layer.mlp.has_value());
      EXPECT_EQ(layer.mlp->down_proj.weight.shape, (std::vector<int64_t>{64, 128}));
      EXPECT_TRUE(layer.experts.empty());
      EXPECT_EQ(layer.router.data, nullptr);
    } else {
      EXPECT_FALSE(layer.mlp.has_value());
      ASSERT_EQ(layer.experts.size(), 8u);
      EXPECT_EQ(layer.router.dtype, DType::F32);
      EXPECT_EQ(layer.router.shape, (std::vector<int64_t>{8, 64}));
      EXPECT_EQ(layer.router_bias.shape, std::vector<int64_t>{8});
      EXPECT_EQ(layer.experts[5].up_proj.weight.name, fmt::format("model.layers.{}.mlp.experts.5.up_proj.weight", i));
      EXPECT_EQ(layer.experts[5].down_proj.weight.shape, (std::vector<int64_t>{64, 32}));
    }
  }
  // The views are the archive's bytes.
  const TensorView& q = weights.archive->at("model.layers.2.self_attn.q_proj.weight");
  EXPECT_EQ(weights.layers[2].q_proj.weight.data, q.data);
}

TEST_F(WeightsTest, TiedEmbeddingsNeedNoLmHead) {
  tiny_.tie_word_embeddings = true;
  write_random_checkpoint(tiny_, dir_, 1, DType::F32);
  const BeamWeights weights = load_checkpoint(dir_);
  EXPECT_EQ(weights.lm_head.weight.data, weights.embed_tokens.data);
  EXPECT_EQ(weights.archive->find("lm_head.weight"), nullptr);
}

TEST_F(WeightsTest, MissingTensorIsNamed) {
  write_checkpoint(tiny_, without(random_checkpoint_tensors(tiny_, 1, DType::BF16), "model.layers.2.self_attn.q_proj.weight"));
  expect_load_error({dir_.string(), "tensor \"model.layers.2.self_attn.q_proj.weight\" is missing", "expected shape [64, 64]"});
  write_checkpoint(tiny_, without(random_checkpoint_tensors(tiny_, 1, DType::BF16), "model.layers.4.mlp.experts.7.down_proj.weight"));
  expect_load_error({"tensor \"model.layers.4.mlp.experts.7.down_proj.weight\" is missing", "[64, 32]"});
  write_checkpoint(tiny_, without(random_checkpoint_tensors(tiny_, 1, DType::BF16), "model.layers.3.mlp.gate.e_score_correction_bias"));
  expect_load_error({"model.layers.3.mlp.gate.e_score_correction_bias", "missing", "F32"});
}

TEST_F(WeightsTest, MisShapedTensorIsNamedWithBothShapes) {
  auto tensors = random_checkpoint_tensors(tiny_, 1, DType::BF16);
  find(tensors, "model.layers.1.self_attn.k_proj.weight").shape = {64, 32};  // transposed
  write_checkpoint(tiny_, tensors);
  expect_load_error({(dir_ / "model.safetensors").string(), "tensor \"model.layers.1.self_attn.k_proj.weight\"",
                     "expected shape [32, 64], found [64, 32]"});
  tensors = random_checkpoint_tensors(tiny_, 1, DType::BF16);
  find(tensors, "model.norm.weight").shape = {65};
  write_checkpoint(tiny_, tensors);
  expect_load_error({"tensor \"model.norm.weight\"", "expected shape [64], found [65]"});
}

TEST_F(WeightsTest, RouterMustBeF32) {
  for (const std::string name : {"model.layers.2.mlp.gate.weight", "model.layers.5.mlp.gate.e_score_correction_bias"}) {
    auto tensors = random_checkpoint_tensors(tiny_, 1, DType::BF16);
    find(tensors, name).dtype = DType::BF16;
    write_checkpoint(tiny_, tensors);
    expect_load_error({"model.safetensors", "tensor \"" + name + "\"", "dtype BF16 is not allowed", "F32"});
  }
}

TEST_F(WeightsTest, WrongDtypesForNormsEmbeddingsAndProjections) {
  const std::vector<std::pair<std::string, DType>> cases = {
      {"model.embed_tokens.weight", DType::I32},
      {"model.layers.0.input_layernorm.weight", DType::F8_E4M3},
      {"model.layers.0.mlp.gate_proj.weight", DType::F8_E4M3},  // quantized code without quantization_config
      {"lm_head.weight", DType::I64},
  };
  for (const auto& [name, dtype] : cases) {
    auto tensors = random_checkpoint_tensors(tiny_, 1, DType::F32);
    TensorSource& tensor = find(tensors, name);
    tensor = random_bytes_tensor(name, dtype, tensor.shape, 2);
    write_checkpoint(tiny_, tensors);
    expect_load_error({"tensor \"" + name + "\"", fmt::format("dtype {} is not allowed", dtype_name(dtype))});
  }
}

TEST_F(WeightsTest, ExtraTensorsAreOnlyAWarning) {
  auto tensors = random_checkpoint_tensors(tiny_, 1, DType::BF16);
  tensors.push_back(tensor_from_floats("model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {8}, std::vector<float>(8, 1.0f)));
  write_checkpoint(tiny_, tensors);
  EXPECT_EQ(load_error(), "");
}

TEST_F(WeightsTest, BadConfigIsNamed) {
  write_random_checkpoint(tiny_, dir_, 1, DType::BF16);
  nlohmann::json document = tiny_.to_json();
  document["topk_group"] = 9;
  write_text_file(dir_ / "config.json", document.dump());
  expect_load_error({(dir_ / "config.json").string(), "key \"topk_group\""});
  fs::remove(dir_ / "config.json");
  expect_load_error({(dir_ / "config.json").string(), "cannot open"});
}

TEST_F(WeightsTest, ShardedRoundTripMatchesSingleFile) {
  const fs::path single = dir_ / "single";
  write_random_checkpoint(tiny_, single, 17, DType::F32);
  const fs::path sharded = dir_ / "sharded";
  write_random_checkpoint(tiny_, sharded, 17, DType::F32, 200 * 1024);
  ASSERT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  const BeamWeights a = load_checkpoint(single), b = load_checkpoint(sharded);
  EXPECT_GT(b.archive->files().size(), 4u);
  EXPECT_EQ(a.archive->tensor_names(), b.archive->tensor_names());
  for (const std::string& name : a.archive->tensor_names()) {
    const TensorView &x = a.archive->at(name), &y = b.archive->at(name);
    ASSERT_EQ(x.nbytes, y.nbytes) << name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << name;
  }
  EXPECT_EQ(std::memcmp(a.layers[3].experts[2].gate_proj.weight.data, b.layers[3].experts[2].gate_proj.weight.data,
                        a.layers[3].experts[2].gate_proj.weight.nbytes), 0);
}

// Generation is counter-based: any split into chunks (as threads take them) gives the same bytes, the
// seed changes them, and the tensor name keys the stream.
TEST_F(WeightsTest, RandomTensorsDoNotDependOnChunking) {
  std::mt19937_64 rng(8);
  const auto tensors = random_checkpoint_tensors(tiny_, 21, DType::BF16);
  const auto other_seed = random_checkpoint_tensors(tiny_, 22, DType::BF16);
  for (std::size_t t = 0; t < tensors.size(); t += 7) {
    const TensorSource& tensor = tensors[t];
    const std::size_t element = dtype_size(tensor.dtype), total = tensor.nbytes();
    std::vector<std::byte> whole(total), pieces(total), reseeded(total);
    tensor.fill(0, whole);
    for (std::size_t offset = 0; offset < total;) {
      const std::size_t size = std::min(total - offset, element * (1 + rng() % 97));
      tensor.fill(offset, std::span<std::byte>(pieces.data() + offset, size));
      offset += size;
    }
    EXPECT_EQ(whole, pieces) << tensor.name;
    other_seed[t].fill(0, reseeded);
    EXPECT_NE(whole, reseeded) << tensor.name;
  }
}

// The tensors of `config` with every projection (outside `ignored`) in the layout of `method`.
std::vector<TensorSource> quantized_tensors(const ModelConfig& config, const std::string& method,
                                            const std::vector<std::string>& ignored) {
  std::vector<TensorSource> tensors;
  auto unquantized = random_checkpoint_tensors(config, 5, DType::BF16);
  uint64_t seed = 100;
  for (const ExpectedTensor& expected : expected_tensors(config)) {
    const TensorSource& original = *std::find_if(unquantized.begin(), unquantized.end(),
                                                 [&](const TensorSource& t) { return t.name == expected.name; });
    const std::string prefix = expected.name.substr(0, expected.name.size() - 7);
    const bool skip = std::any_of(ignored.begin(), ignored.end(), [&](const std::string& p) { return prefix.starts_with(p); });
    if (expected.role != TensorRole::Projection || skip) {
      tensors.push_back(original);
      continue;
    }
    const int64_t out = expected.shape[0], in = expected.shape[1];
    const auto random = [&](std::string name, DType dtype, std::vector<int64_t> shape) {
      return random_bytes_tensor(std::move(name), dtype, std::move(shape), seed++);
    };
    if (method == "fp8") {
      tensors.push_back(random(expected.name, DType::F8_E4M3, {out, in}));
      tensors.push_back(random(prefix + ".weight_scale_inv", DType::F32, {(out + 127) / 128, (in + 127) / 128}));
    } else if (method == "mxfp8") {
      tensors.push_back(random(expected.name, DType::F8_E4M3, {out, in}));
      tensors.push_back(random(prefix + ".weight_scale", DType::U8, {out, in / 32}));
    } else {
      tensors.push_back(random(expected.name, DType::U8, {out, in / 2}));
      tensors.push_back(random(prefix + ".weight_scale", DType::F8_E4M3, {out, in / 16}));
      tensors.push_back(random(prefix + ".weight_scale_2", DType::F32, {}));
    }
  }
  return tensors;
}

TEST_F(WeightsTest, QuantizedLayoutsLoad) {
  for (const std::string method : {"fp8", "mxfp8", "modelopt"}) {
    ModelConfig config = tiny_;
    config.quantization = QuantizationConfig{method, method == "modelopt" ? "NVFP4" : "", {}, {"lm_head", "model.layers.0.mlp"}};
    if (method == "fp8") config.quantization->weight_block_size = {128, 128};
    write_checkpoint(config, quantized_tensors(config, method, config.quantization->ignored_layers));
    const BeamWeights weights = load_checkpoint(dir_);
    EXPECT_FALSE(weights.lm_head.quantized()) << method;
    EXPECT_FALSE(weights.layers[0].mlp->up_proj.quantized()) << method;
    const LinearWeight& q = weights.layers[0].q_proj;
    EXPECT_TRUE(q.quantized()) << method;
    EXPECT_EQ(q.out_features(), 64);
    const LinearWeight& down = weights.layers[2].experts[1].down_proj;  // [64, 32]
    EXPECT_TRUE(down.quantized());
    if (method == "fp8") {
      EXPECT_EQ(down.scale.shape, (std::vector<int64_t>{1, 1}));
      EXPECT_EQ(down.scale.name, "model.layers.2.mlp.experts.1.down_proj.weight_scale_inv");
    } else if (method == "mxfp8") {
      EXPECT_EQ(down.scale.shape, (std::vector<int64_t>{64, 1}));
      EXPECT_EQ(down.weight.dtype, DType::F8_E4M3);
    } else {
      EXPECT_EQ(down.weight.shape, (std::vector<int64_t>{64, 16}));
      EXPECT_EQ(down.scale.shape, (std::vector<int64_t>{64, 2}));
      EXPECT_EQ(down.scale_2.shape, std::vector<int64_t>{});
      EXPECT_EQ(down.scale_2.dtype, DType::F32);
    }
    EXPECT_EQ(weights.layers[1].router.dtype, DType::F32);
  }
}

TEST_F(WeightsTest, QuantizedLayoutErrorsAreNamed) {
  ModelConfig config = tiny_;
  config.quantization = QuantizationConfig{"fp8", "", {128, 128}, {"lm_head"}};
  auto tensors = quantized_tensors(config, "fp8", {"lm_head"});
  find(tensors, "model.layers.1.self_attn.o_proj.weight_scale_inv") =
      random_bytes_tensor("model.layers.1.self_attn.o_proj.weight_scale_inv", DType::F32, {2, 1}, 9);
  write_checkpoint(config, tensors);
  expect_load_error({"tensor \"model.layers.1.self_attn.o_proj.weight_scale_inv\"", "expected shape [1, 1], found [2, 1]"});

  tensors = quantized_tensors(config, "fp8", {"lm_head"});
  tensors = without(tensors, "model.layers.3.mlp.experts.0.gate_proj.weight_scale_inv");
  write_checkpoint(config, tensors);
  expect_load_error({"tensor \"model.layers.3.mlp.experts.0.gate_proj.weight_scale_inv\" is missing"});

  // Quantized although ignored_layers says it stays unquantized.
  tensors = quantized_tensors(config, "fp8", {});
  write_checkpoint(config, tensors);
  expect_load_error({"tensor \"lm_head.weight\"", "ignored_layers"});

  // An NVFP4 scale in the wrong dtype.
  config.quantization = QuantizationConfig{"modelopt", "NVFP4", {}, {}};
  tensors = quantized_tensors(config, "modelopt", {});
  find(tensors, "model.layers.0.self_attn.v_proj.weight_scale") =
      random_bytes_tensor("model.layers.0.self_attn.v_proj.weight_scale", DType::U8, {32, 4}, 3);
  write_checkpoint(config, tensors);
  expect_load_error({"tensor \"model.layers.0.self_attn.v_proj.weight_scale\"", "dtype U8 is not allowed", "F8_E4M3"});

  // mxfp8 needs in_features divisible by 32 (tiny's experts down_proj has in = 32, so shrink moe_intermediate).
  config = tiny_;
  config.moe_intermediate_size = 48;
  config.quantization = QuantizationConfig{"mxfp8", "", {}, {}};
  auto bf16 = random_checkpoint_tensors(config, 1, DType::BF16);
  find(bf16, "model.layers.1.mlp.experts.0.down_proj.weight") =
      random_bytes_tensor("model.layers.1.mlp.experts.0.down_proj.weight", DType::F8_E4M3, {64, 48}, 4);
  write_checkpoint(config, bf16);
  expect_load_error({"tensor \"model.layers.1.mlp.experts.0.down_proj.weight\"", "divisible by 32"});
}

}  // namespace
}  // namespace beamline

// --load-format dummy: random weights drawn by the backend are the bytes make-model writes for the same seed, so a
// dummy model and the checkpoint give the same logits; and the option checks of ModelSource.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "backend/backend.h"
#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/model_source.h"
#include "checkpoint/presets.h"
#include "../model/model_test_support.h"
#include "util/error.h"

namespace beamline {
namespace {

TEST(DummyWeights, EqualTheCheckpointOfTheSameSeed) {
  testing::TempDir dir("dummy");
  const ModelConfig config = preset_config("tiny");
  const std::vector<int32_t> tokens{3, 17, 250, 4, 99, 12, 7, 300};
  const std::vector<float> from_checkpoint =
      testing::cpu_prefill_logits(testing::write_and_load(config, dir.path(), 7), tokens);
  const std::vector<float> from_dummy = testing::cpu_prefill_logits(dummy_weights(config, 7), tokens);
  ASSERT_EQ(from_checkpoint.size(), from_dummy.size());
  EXPECT_EQ(0, std::memcmp(from_checkpoint.data(), from_dummy.data(), from_dummy.size() * sizeof(float)));
  const std::vector<float> other_seed = testing::cpu_prefill_logits(dummy_weights(config, 8), tokens);
  EXPECT_NE(0, std::memcmp(other_seed.data(), from_dummy.data(), from_dummy.size() * sizeof(float)));
}

TEST(DummyWeights, RandomWeightIsTheWriterFormula) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  const Tensor tensor = backend->random_weight(DType::BF16, {3, 5}, 42, 1.0f, 0.1f);
  const std::vector<float> values = [&] {
    std::vector<float> out;
    for (int64_t i = 0; i < 15; ++i) out.push_back(bf16_to_f32(tensor.data<const uint16_t>()[i]));
    return out;
  }();
  for (float v : values) EXPECT_NEAR(v, 1.0f, 0.6f);
  EXPECT_NE(values[0], values[1]);
  EXPECT_THROW(backend->random_weight(DType::I32, {2}, 1, 0.0f, 1.0f), Error);
}

TEST(ModelSource, PresetWithOverridesKeepsTheLayerPattern) {
  ModelSource source;
  source.model = "beam-1.0";
  source.load_format = "dummy";
  source.hf_overrides = R"({"num_hidden_layers": 8})";
  const BeamWeights weights = source.load();
  EXPECT_EQ(weights.config.num_hidden_layers, 8);
  ASSERT_EQ(weights.layers.size(), 8u);
  const ModelConfig full = preset_config("beam-1.0");
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(weights.config.layer_types[i], full.layer_types[i]) << i;
  EXPECT_EQ(weights.layers[5].experts.size(), 256u);
  EXPECT_EQ(weights.layers[5].experts[3].down_proj.weight.data, nullptr);
}

TEST(ModelSource, DummyFromAModelDirectoryWithoutWeights) {
  testing::TempDir dir("no-weights");
  ModelConfig config = preset_config("small");
  write_model_files(config, dir.path());
  for (const char* file : {"config.json", "generation_config.json", "harmony.json", "tokenizer.json"})
    EXPECT_TRUE(std::filesystem::exists(dir.path() / file)) << file;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors"));
  ModelSource source;
  source.model = dir.path().string();
  source.load_format = "dummy";
  source.hf_overrides = R"({"num_hidden_layers": 3})";
  const BeamWeights weights = source.load();
  EXPECT_EQ(weights.config.hidden_size, config.hidden_size);
  EXPECT_EQ(weights.layers.size(), 3u);
  source.load_format = "auto";
  source.hf_overrides.clear();
  EXPECT_THROW((void)source.load(), Error);  // no safetensors there
}

TEST(ModelSource, BadOptionsSayWhich) {
  auto message = [](const ModelSource& source) {
    try {
      (void)source.load();
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  ModelSource source;
  source.model = "tiny";
  source.load_format = "pt";
  EXPECT_NE(message(source).find("--load-format"), std::string::npos);
  source.load_format = "dummy";
  source.hf_overrides = "{not json";
  EXPECT_NE(message(source).find("--hf-overrides"), std::string::npos);
  source.hf_overrides = "[1]";
  EXPECT_NE(message(source).find("--hf-overrides"), std::string::npos);
  source.hf_overrides = R"({"num_hidden_layers": 0})";
  EXPECT_NE(message(source).find("num_hidden_layers"), std::string::npos);
  source.hf_overrides.clear();
  source.model = "no-such-preset";
  EXPECT_NE(message(source).find("no-such-preset"), std::string::npos);
  source.model = "tiny";
  source.load_format = "auto";
  source.hf_overrides = R"({"num_hidden_layers": 2})";
  EXPECT_NE(message(source).find("--hf-overrides"), std::string::npos);
}

}  // namespace
}  // namespace beamline

// vLLM's per-tensor FP8 KV cache scales in a checkpoint (model.layers.N.self_attn.k_scale / v_scale): loaded as the
// layer's scales (shape [] or [1], F32), 1.0 for a layer without them, and a bad one (shape, dtype, zero, negative,
// not finite) refused naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "model/beam_model.h"
#include "util/error.h"
#include "../model/model_test_support.h"

namespace beamline {
namespace {

void write_with_scales(const std::filesystem::path& dir, const ModelConfig& config, std::vector<TensorSource> extra) {
  std::vector<TensorSource> tensors = random_checkpoint_tensors(config, 5, DType::BF16);
  for (TensorSource& tensor : extra) tensors.push_back(std::move(tensor));
  write_model_files(config, dir);
  write_safetensors_checkpoint(dir, tensors);
}

TensorSource scalar(const std::string& name, float value, std::vector<int64_t> shape = {}, DType dtype = DType::F32) {
  return tensor_from_floats(name, dtype, std::move(shape), std::vector<float>{value});
}

TEST(KvScales, CheckpointScalesAreLoadedAndOthersAreOne) {
  const ModelConfig config = preset_config("tiny");
  testing::TempDir dir("kv-scales");
  write_with_scales(dir.path(), config,
                    {scalar("model.layers.0.self_attn.k_scale", 2.5f),
                     scalar("model.layers.0.self_attn.v_scale", 0.125f),
                     scalar("model.layers.1.self_attn.k_scale", 7.0f, {1})});
  const BeamWeights weights = load_checkpoint(dir.path());
  EXPECT_EQ(weights.layers[0].k_scale, 2.5f);
  EXPECT_EQ(weights.layers[0].v_scale, 0.125f);
  EXPECT_EQ(weights.layers[1].k_scale, 7.0f);
  EXPECT_FALSE(weights.layers[1].v_scale.has_value());
  EXPECT_FALSE(weights.layers[2].k_scale.has_value());

  std::unique_ptr<Backend> backend = create_backend("cpu");
  const BeamModel model(weights, *backend);
  std::vector<float> expected(static_cast<std::size_t>(2 * config.num_hidden_layers), 1.0f);
  expected[0] = 2.5f;
  expected[1] = 0.125f;
  expected[2] = 7.0f;
  EXPECT_EQ(model.kv_scales().shape(), (std::vector<int64_t>{config.num_hidden_layers, 2}));
  EXPECT_EQ(backend->download_f32(model.kv_scales()), expected);
}

TEST(KvScales, BadScalesAreRefusedNamingTheTensor) {
  const ModelConfig config = preset_config("tiny");
  testing::TempDir dir("kv-scales-bad");
  const std::string name = "model.layers.1.self_attn.v_scale";
  const auto refused = [&](TensorSource bad, const std::string& why) {
    write_with_scales(dir.path(), config, {std::move(bad)});
    try {
      load_checkpoint(dir.path());
      FAIL() << "no error; expected one containing \"" << why << "\"";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("\"" + name + "\""), std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
    }
  };
  refused(tensor_from_floats(name, DType::F32, {2}, {1.0f, 2.0f}), "expected shape [] or [1]");
  refused(scalar(name, 1.0f, {}, DType::BF16), "dtype BF16 is not allowed here (expected F32)");
  refused(scalar(name, 0.0f), "must be finite and > 0");
  refused(scalar(name, -2.0f), "must be finite and > 0");
  refused(scalar(name, std::numeric_limits<float>::infinity()), "must be finite and > 0");
  refused(scalar(name, std::numeric_limits<float>::quiet_NaN()), "must be finite and > 0");
}

}  // namespace
}  // namespace beamline

// The block drafter's checkpoint: a drafter written for the tiny target loads; one that does not fit the target, or
// whose tensors are missing, misshapen, mistyped or foreign, is refused naming the key or tensor.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/drafter_checkpoint.h"
#include "checkpoint/presets.h"
#include "util/error.h"

namespace beamline {
namespace {

namespace fs = std::filesystem;

class DrafterCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("beamline-drafter-{}-{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    target_ = preset_config("tiny");
    config_ = {{"architectures", {"BeamDrafter"}},
               {"hidden_size", target_.hidden_size},
               {"num_hidden_layers", 2},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"head_dim", 16},
               {"intermediate_size", 48},
               {"sliding_window", 64},
               {"rope_theta", 10000.0},
               {"dflash_config", {{"target_layer_ids", {0, target_.num_hidden_layers - 1}}, {"block_size", 8},
                                  {"mask_token_id", target_.vocab_size - 1}}}};
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes the config and the tensors it implies, after `edit` may change them.
  void write(const std::function<void(std::vector<TensorSource>&)>& edit = {}) {
    write_text_file(dir_ / "config.json", config_.dump(2));
    std::vector<TensorSource> tensors;
    for (const ExpectedTensor& expected : expected_drafter_tensors(DrafterConfig::load(dir_))) {
      int64_t count = 1;
      for (int64_t d : expected.shape) count *= d;
      tensors.push_back(tensor_from_floats(expected.name, DType::BF16, expected.shape,
                                           std::vector<float>(static_cast<std::size_t>(count), 0.01f)));
    }
    if (edit) edit(tensors);
    write_safetensors(dir_ / "model.safetensors", tensors);
  }

  std::string error(int32_t k = 7) {
    try {
      load_drafter_checkpoint(dir_, target_, k);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  ModelConfig target_;
  nlohmann::json config_;
};

TEST_F(DrafterCheckpointTest, AFittingDrafterLoads) {
  write();
  const DrafterCheckpoint drafter = load_drafter_checkpoint(dir_, target_, 7);
  EXPECT_EQ(drafter.config.block_size, 8);
  EXPECT_EQ(drafter.config.target_layer_ids.size(), 2u);
  EXPECT_EQ(drafter.archive->tensor_count(), 2u + 2u * 11u);
}

TEST_F(DrafterCheckpointTest, AMisfitIsRefusedNamingTheKey) {
  write();
  EXPECT_NE(error(8).find("num_speculative_tokens"), std::string::npos) << "8 > block_size - 1";
  config_["dflash_config"]["target_layer_ids"] = {0, target_.num_hidden_layers};
  write();
  EXPECT_NE(error().find("dflash_config.target_layer_ids[1]"), std::string::npos) << error();
  SetUp();
  config_["hidden_size"] = target_.hidden_size * 2;
  write();
  EXPECT_NE(error().find("\"hidden_size\""), std::string::npos) << error();
  SetUp();
  config_["dflash_config"]["mask_token_id"] = target_.vocab_size;
  write();
  EXPECT_NE(error().find("dflash_config.mask_token_id"), std::string::npos) << error();
  SetUp();
  config_["architectures"] = {"BeamForCausalLM"};
  write_text_file(dir_ / "config.json", config_.dump());
  EXPECT_NE(error().find("architectures"), std::string::npos) << error();
  SetUp();
  config_["dflash_config"].erase("block_size");
  write_text_file(dir_ / "config.json", config_.dump());
  EXPECT_NE(error().find("dflash_config.block_size"), std::string::npos) << error();
}

TEST_F(DrafterCheckpointTest, BadTensorsAreRefusedNamingTheTensor) {
  write([](std::vector<TensorSource>& tensors) { tensors.erase(tensors.begin() + 4); });  // layers.0.self_attn.k_proj.weight
  EXPECT_NE(error().find("\"layers.0.self_attn.k_proj.weight\" is missing"), std::string::npos) << error();
  write([](std::vector<TensorSource>& tensors) {
    tensors[0] = tensor_from_floats("fc.weight", DType::BF16, {4, 4}, std::vector<float>(16, 0.0f));
  });
  EXPECT_NE(error().find("\"fc.weight\": expected shape"), std::string::npos) << error();
  write([&](std::vector<TensorSource>& tensors) {
    tensors.push_back(tensor_from_floats("model.embed_tokens.weight", DType::BF16, {2, 2}, std::vector<float>(4, 0.0f)));
  });
  EXPECT_NE(error().find("\"model.embed_tokens.weight\" is not a drafter tensor"), std::string::npos) << error();
}

}  // namespace
}  // namespace beamline

// vLLM's sleep mode in BeamModelRunner (docs/rl.md): sleep() drops the backend with everything on it, wake_up() makes
// it again from the host weights, and the logits are those from before, bit for bit; new weights that arrive while
// asleep are built at wake_up and give a fresh runner's logits on them. A distributed runner keeps its memory
// (tests/parallel); asleep, a step is refused naming /wake_up.
#include <gtest/gtest.h>

#include <cstring>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
#include "checkpoint/safetensors.h"
#include "../model/model_test_support.h"
#include "engine/engine_config.h"
#include "runner/beam_model_runner.h"
#include "runner/kv_cache.h"
#include "util/error.h"

namespace beamline {
namespace {

const std::vector<int32_t> kTokens{3, 17, 250, 4, 99, 12, 7, 300};

EngineConfig small_config() {
  EngineConfig config;
  config.kv_cache_memory_bytes = int64_t{1} << 20;
  config.max_num_seqs = 4;
  return config;
}

// The logits of every position of kTokens in one prefill step.
std::vector<float> prefill(BeamModelRunner& runner) {
  SingleSequenceBlocks blocks(runner.kv_layout(), runner.sliding_window());
  ForwardBatch batch;
  batch.tokens = kTokens;
  const auto count = static_cast<int32_t>(kTokens.size());
  batch.sequences.push_back(SequenceSlice{0, count, 0, blocks.prepare(0, count)});
  std::vector<RowSampling> rows;
  for (int32_t r = 0; r < count; ++r) {
    batch.logit_rows.push_back(r);
    RowSampling row;
    row.settings.logit_row = r;
    row.settings.greedy = true;
    rows.push_back(std::move(row));
  }
  std::unique_ptr<ModelStep> step = runner.launch(batch);
  step->sample(std::move(rows));
  (void)step->tokens();
  return step->raw_logits(batch.logit_rows);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SleepMode, WakingUpGivesTheSameLogits) {
  testing::TempDir dir("sleep");
  BeamModelRunner runner(testing::write_and_load(preset_config("tiny"), dir.path(), 3), "cpu", small_config());
  const std::vector<float> before = prefill(runner);
  for (int32_t level : {1, 2}) {
    ASSERT_TRUE(runner.sleep(level));
    try {
      (void)prefill(runner);
      ADD_FAILURE() << "a step ran asleep";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("/wake_up first"), std::string::npos) << error.what();
    }
    runner.wake_up();
    EXPECT_TRUE(same_bits(prefill(runner), before)) << "level " << level;
  }
}

TEST(SleepMode, WeightsSentWhileAsleepAreBuiltAtWakeUp) {
  testing::TempDir first_dir("first"), next_dir("next");
  const ModelConfig config = preset_config("tiny");
  BeamModelRunner runner(testing::write_and_load(config, first_dir.path(), 3), "cpu", small_config());
  const BeamWeights next = testing::write_and_load(config, next_dir.path(), 4);
  BeamModelRunner fresh(next, "cpu", small_config());
  const std::vector<float> expected = prefill(fresh);
  ASSERT_TRUE(runner.sleep(2));
  std::vector<HostTensor> tensors;
  for (const std::string& name : next.archive->tensor_names()) {
    const TensorView& view = next.archive->at(name);
    auto bytes = std::make_shared<std::vector<std::byte>>(view.data, view.data + view.nbytes);
    tensors.push_back({TensorView{view.name, view.dtype, view.shape, bytes->data(), bytes->size()}, std::move(bytes)});
  }
  runner.update_weights(tensors);
  runner.wake_up();
  EXPECT_TRUE(same_bits(prefill(runner), expected));
  ASSERT_TRUE(runner.sleep(1));
  runner.load_weights_from_disk(first_dir.path());
  runner.load_weights_from_disk(next_dir.path());
  runner.wake_up();
  EXPECT_TRUE(same_bits(prefill(runner), expected));
}

}  // namespace
}  // namespace beamline

#pragma once
// Random checkpoints written to a temporary directory and loaded back, and their logits on the CPU, for the model
// tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "model/beam_model.h"
#include "model/weights.h"
#include "runner/sequence_runner.h"

namespace beamline::testing {

// A fresh directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& label) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("beamline-" + label + "-" + (info ? std::string(info->name()) : "test") + "-" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline BeamWeights write_and_load(const ModelConfig& config, const std::filesystem::path& dir, uint64_t seed,
                                  DType dtype = DType::BF16) {
  write_random_checkpoint(config, dir, seed, dtype);
  return load_checkpoint(dir);
}

// The logits of every position of `tokens`, prefilled as one sequence on the CPU backend.
inline std::vector<float> cpu_prefill_logits(const BeamWeights& weights, std::span<const int32_t> tokens) {
  const std::unique_ptr<Backend> backend = create_backend("cpu");
  BeamModel model(weights, *backend);
  const auto count = static_cast<int64_t>(tokens.size());
  SequenceRunner runner(model, count, count);
  return runner.step(tokens, true);
}

}  // namespace beamline::testing

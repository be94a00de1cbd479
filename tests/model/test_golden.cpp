// beamline's logits against float64 values computed independently by tools/reference/beam_numpy.py:
//  - committed golden files (tests/data/golden, made by tools/reference/make_golden.py), for checkpoints
//    rebuilt here with the same writer, seed and dtype as `beamline make-model`;
//  - and, when /usr/bin/python3 has numpy, the reference run live on fresh checkpoints through the CLI.
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
#include "model_test_support.h"
#include "util/npy.h"
#include "test_paths.h"

namespace beamline::testing {
namespace {

const std::filesystem::path kGolden = std::filesystem::path(test_paths::source_dir()) / "tests/data/golden";

DType dtype_of(const std::string& name) {
  if (name == "bf16") return DType::BF16;
  if (name == "f16") return DType::F16;
  return DType::F32;
}

nlohmann::json load_cases() {
  std::ifstream in(kGolden / "cases.json");
  return nlohmann::json::parse(in);
}

ModelConfig config_of(const nlohmann::json& golden_case) {
  if (golden_case.contains("preset")) return preset_config(golden_case["preset"].get<std::string>());
  return ModelConfig::load(kGolden / golden_case["config"].get<std::string>());
}

// Max |diff| <= 1e-3 and the same argmax at every position.
void expect_matches_reference(const std::vector<float>& actual, const NpyArray& reference, int64_t positions,
                              int64_t vocab, const std::string& what) {
  ASSERT_EQ(reference.shape, (std::vector<int64_t>{positions, vocab})) << what;
  ASSERT_EQ(actual.size(), reference.values.size()) << what;
  double worst = 0;
  for (int64_t p = 0; p < positions; ++p) {
    int64_t best_actual = 0, best_reference = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const std::size_t i = static_cast<std::size_t>(p * vocab + v);
      worst = std::max(worst, std::abs(actual[i] - reference.values[i]));
      if (actual[i] > actual[p * vocab + best_actual]) best_actual = v;
      if (reference.values[i] > reference.values[p * vocab + best_reference]) best_reference = v;
    }
    EXPECT_EQ(best_actual, best_reference) << what << ": argmax at position " << p;
  }
  EXPECT_LE(worst, 1e-3) << what << ": largest |beamline - reference|";
  ::testing::Test::RecordProperty(what + "_max_abs_diff", std::to_string(worst));
}

TEST(Golden, CommittedReferenceLogits) {
  const nlohmann::json cases = load_cases();
  ASSERT_GE(cases.size(), 4u);
  for (const auto& golden_case : cases) {
    const std::string name = golden_case["name"];
    SCOPED_TRACE(name);
    const ModelConfig config = config_of(golden_case);
    TempDir dir("golden-" + name);
    write_random_checkpoint(config, dir.path(), golden_case["seed"].get<uint64_t>(),
                            dtype_of(golden_case["dtype"].get<std::string>()));
    const std::vector<int32_t> tokens = golden_case["tokens"].get<std::vector<int32_t>>();
    const NpyArray reference = read_npy(kGolden / (name + ".npy"));
    expect_matches_reference(cpu_prefill_logits(load_checkpoint(dir.path()), tokens), reference,
                             static_cast<int64_t>(tokens.size()), config.vocab_size, name);
  }
}

bool python_has_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") == 0; }

// Fresh checkpoints (other seeds and tokens than the golden files), `beamline logits` vs beam_numpy.py.
TEST(Golden, LiveNumpyReferenceThroughTheCli) {
  if (!python_has_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy is not available";
  const nlohmann::json cases = load_cases();
  for (const auto& golden_case : cases) {
    const std::string name = golden_case["name"];
    SCOPED_TRACE(name);
    const ModelConfig config = config_of(golden_case);
    TempDir dir("live-" + name);
    const std::filesystem::path model = dir.path() / "model";
    write_random_checkpoint(config, model, golden_case["seed"].get<uint64_t>() + 100, DType::BF16);
    std::vector<int32_t> tokens;
    std::string token_list;
    for (int i = 0; i < 15; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 37 + 11) % config.vocab_size));
      if (i > 0) token_list += ',';
      token_list += std::to_string(tokens.back());
    }
    const std::filesystem::path ours = dir.path() / "beamline.npy", theirs = dir.path() / "numpy.npy";
    const std::string run_ours = test_paths::beamline_exe() + " logits --model " + model.string() + " --tokens " +
                                 token_list + " --out " + ours.string() + " 2> /dev/null";
    const std::string run_theirs = "/usr/bin/python3 " + test_paths::source_dir() + "/tools/reference/beam_numpy.py --model " +
                                   model.string() + " --tokens " + token_list + " --out " + theirs.string();
    ASSERT_EQ(std::system(run_ours.c_str()), 0) << run_ours;
    ASSERT_EQ(std::system(run_theirs.c_str()), 0) << run_theirs;
    const NpyArray ours_array = read_npy(ours);
    const std::vector<float> ours_values(ours_array.values.begin(), ours_array.values.end());
    expect_matches_reference(ours_values, read_npy(theirs), static_cast<int64_t>(tokens.size()), config.vocab_size,
                             name);
  }
}

}  // namespace
}  // namespace beamline::testing

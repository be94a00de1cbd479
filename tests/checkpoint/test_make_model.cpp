// `beamline make-model` end to end: the tiny preset loads, is deterministic and non-degenerate, its
// tokenizer.json has the agreed shape; beam-1.0 has the exact tensor names, shapes and parameter count.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/synthetic_tokenizer.h"
#include "model/weights.h"
#include "util/error.h"
#include "test_paths.h"

namespace beamline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RunResult {
  int exit_code;
  std::string output;
};

RunResult run_beamline(const std::string& arguments, const std::string& environment = "") {
  const std::string command = environment + " " + test_paths::beamline_exe() + " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buffer[65536];
  std::size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, got);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// GPT-2's bytes_to_unicode, written from its definition: printable Latin-1 bytes map to themselves, the
// rest to 256, 257, ... in byte order.
std::vector<std::u32string> reference_byte_spellings() {
  std::vector<std::u32string> spellings(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    spellings[b] = std::u32string(1, static_cast<char32_t>(printable ? b : next++));
  }
  return spellings;
}

std::u32string utf8_to_u32(const std::string& text) {
  std::u32string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out += c;
      i += 1;
    } else {
      out += static_cast<char32_t>(((c & 0x1f) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3f));
      i += 2;
    }
  }
  return out;
}

std::vector<float> as_floats(const TensorView& view) {
  EXPECT_EQ(view.dtype, DType::F32) << view.name;
  return std::vector<float>(view.as<float>(), view.as<float>() + view.numel());
}

std::pair<double, double> mean_and_stddev(const std::vector<float>& values) {
  double sum = 0, squares = 0;
  for (float v : values) sum += v, squares += static_cast<double>(v) * v;
  const double mean = sum / static_cast<double>(values.size());
  return {mean, std::sqrt(squares / static_cast<double>(values.size()) - mean * mean)};
}

class MakeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("beamline_mm_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MakeModelTest, TinyLoadsAndShipsItsFiles) {
  const RunResult result = run_beamline(fmt::format("make-model --preset tiny --out {} --seed 7", (dir_ / "tiny").string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const BeamWeights weights = load_checkpoint(dir_ / "tiny");
  EXPECT_EQ(weights.config.to_json(), preset_config("tiny").to_json());
  EXPECT_EQ(weights.layers.size(), 6u);
  EXPECT_EQ(weights.layers[0].q_proj.weight.dtype, DType::BF16);
  EXPECT_EQ(weights.layers[1].router.dtype, DType::F32);

  const json generation = json::parse(read_file(dir_ / "tiny" / "generation_config.json"));
  EXPECT_EQ(generation["eos_token_id"], json(weights.config.eos_token_ids));
  EXPECT_EQ(generation["eos_token_id"][0], harmony_special_token_id(512, "<|return|>"));
  const json harmony = json::parse(read_file(dir_ / "tiny" / "harmony.json"));
  EXPECT_EQ(harmony["stop_tokens"], json({"<|return|>", "<|call|>"}));
  EXPECT_EQ(harmony["channels"], json({"analysis", "commentary", "final"}));
  EXPECT_EQ(harmony["final_channel"], "final");
}

TEST_F(MakeModelTest, TokenizerJsonHasTheAgreedShape) {
  ASSERT_EQ(run_beamline(fmt::format("make-model --preset tiny --out {}", dir_.string())).exit_code, 0);
  const json tokenizer = json::parse(read_file(dir_ / "tokenizer.json"));
  EXPECT_EQ(tokenizer["version"], "1.0");
  EXPECT_TRUE(tokenizer["normalizer"].is_null());
  EXPECT_TRUE(tokenizer["post_processor"].is_null());
  const json& pre = tokenizer["pre_tokenizer"];
  EXPECT_EQ(pre["type"], "Sequence");
  ASSERT_EQ(pre["pretokenizers"].size(), 2u);
  EXPECT_EQ(pre["pretokenizers"][0]["type"], "Split");
  EXPECT_EQ(pre["pretokenizers"][0]["behavior"], "Isolated");
  EXPECT_EQ(pre["pretokenizers"][0]["invert"], false);
  const std::string pattern = pre["pretokenizers"][0]["pattern"]["Regex"];
  EXPECT_EQ(pattern.find("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*"), 0u) << pattern;
  EXPECT_NE(pattern.find("|\\p{N}{1,3}|"), std::string::npos);
  EXPECT_EQ(pre["pretokenizers"][1], json({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}));
  EXPECT_EQ(tokenizer["decoder"], json({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}));

  const json& added = tokenizer["added_tokens"];
  const std::vector<std::string> specials = {"<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                                             "<|start|>",       "<|end|>",       "<|message|>", "<|call|>"};
  ASSERT_EQ(added.size(), specials.size());
  for (std::size_t i = 0; i < specials.size(); ++i) {
    EXPECT_EQ(added[i]["id"], 503 + static_cast<int>(i));
    EXPECT_EQ(added[i]["content"], specials[i]);
    EXPECT_EQ(added[i]["special"], true);
    EXPECT_EQ(added[i]["normalized"], false);
    EXPECT_EQ(added[i]["single_word"], false);
    EXPECT_EQ(added[i]["lstrip"], false);
    EXPECT_EQ(added[i]["rstrip"], false);
  }

  const json& model = tokenizer["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_EQ(model["byte_fallback"], false);
  EXPECT_EQ(model["ignore_merges"], false);
  EXPECT_TRUE(model["unk_token"].is_null());
  const json& vocab = model["vocab"];
  ASSERT_EQ(vocab.size(), 503u);
  std::map<int, std::string> by_id;
  for (const auto& [token, id] : vocab.items()) EXPECT_TRUE(by_id.emplace(id.get<int>(), token).second) << "duplicate id " << id;
  ASSERT_EQ(by_id.begin()->first, 0);
  ASSERT_EQ(by_id.rbegin()->first, 502);  // dense ids 0..502, specials above
  const auto reference = reference_byte_spellings();
  for (int b = 0; b < 256; ++b) EXPECT_EQ(utf8_to_u32(by_id[b]), reference[b]) << "byte " << b;

  std::set<std::string> vocabulary;
  for (const auto& [token, id] : vocab.items()) vocabulary.insert(token);
  const json& merges = model["merges"];
  EXPECT_GE(merges.size(), 247u);
  for (const json& merge : merges) {
    ASSERT_EQ(merge.size(), 2u);
    const std::string left = merge[0], right = merge[1];
    EXPECT_TRUE(vocabulary.contains(left)) << left;
    EXPECT_TRUE(vocabulary.contains(right)) << right;
    EXPECT_TRUE(vocabulary.contains(left + right)) << left << right;
  }
  // Learned on English text: common words with their leading space (Ġ) became tokens.
  EXPECT_TRUE(vocabulary.contains("\xc4\xa0" "the")) << "no ' the' token";
  EXPECT_TRUE(vocabulary.contains("\xc4\xa0" "and"));
}

TEST_F(MakeModelTest, LargeVocabularyTokenizerFillsEveryId) {
  const json tokenizer = json::parse(synthetic_tokenizer_json(20000));
  EXPECT_EQ(tokenizer["model"]["vocab"].size(), 20000u - 9);
  EXPECT_EQ(tokenizer["added_tokens"][8]["id"], 19999);
  std::set<int> ids;
  for (const auto& [token, id] : tokenizer["model"]["vocab"].items()) ids.insert(id.get<int>());
  EXPECT_EQ(ids.size(), 20000u - 9);
  EXPECT_EQ(*ids.rbegin(), 20000 - 10);
  EXPECT_THROW(synthetic_tokenizer_json(264), Error);
}

TEST_F(MakeModelTest, SameSeedSameBytesWhateverTheThreads) {
  ASSERT_EQ(run_beamline(fmt::format("make-model --preset tiny --out {} --seed 5", (dir_ / "a").string()), "BEAMLINE_NUM_THREADS=1").exit_code, 0);
  ASSERT_EQ(run_beamline(fmt::format("make-model --preset tiny --out {} --seed 5", (dir_ / "b").string()), "BEAMLINE_NUM_THREADS=3").exit_code, 0);
  ASSERT_EQ(run_beamline(fmt::format("make-model --preset tiny --out {} --seed 6", (dir_ / "c").string())).exit_code, 0);
  const std::string a = read_file(dir_ / "a" / "model.safetensors");
  EXPECT_GT(a.size(), 800000u);
  EXPECT_EQ(a, read_file(dir_ / "b" / "model.safetensors"));
  EXPECT_NE(a, read_file(dir_ / "c" / "model.safetensors"));
  EXPECT_EQ(a.size(), read_file(dir_ / "c" / "model.safetensors").size());
  EXPECT_EQ(read_file(dir_ / "a" / "tokenizer.json"), read_file(dir_ / "c" / "tokenizer.json"));
}

TEST_F(MakeModelTest, RandomWeightsHaveTheIntendedScales) {
  ASSERT_EQ(run_beamline(fmt::format("make-model --preset tiny --out {} --dtype f32 --seed 11", dir_.string())).exit_code, 0);
  const BeamWeights w = load_checkpoint(dir_);
  const auto [embed_mean, embed_std] = mean_and_stddev(as_floats(w.embed_tokens));
  EXPECT_NEAR(embed_mean, 0.0, 0.03);
  EXPECT_NEAR(embed_std, 1.0, 0.03);
  for (const LayerWeights& layer : w.layers) {
    for (const TensorView* norm : {&layer.input_layernorm, &layer.post_attention_layernorm, &layer.pre_feedforward_layernorm,
                                   &layer.post_feedforward_layernorm}) {
      const auto [mean, stddev] = mean_and_stddev(as_floats(*norm));
      EXPECT_NEAR(mean, 1.0, 0.05) << norm->name;
      EXPECT_NEAR(stddev, 0.1, 0.04) << norm->name;
    }
    for (const LinearWeight* projection : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj}) {
      const auto [mean, stddev] = mean_and_stddev(as_floats(projection->weight));
      EXPECT_NEAR(stddev * std::sqrt(static_cast<double>(projection->weight.shape[1])), 1.0, 0.08) << projection->weight.name;
      EXPECT_NEAR(mean, 0.0, 0.02);
    }
  }
  // The router varies by expert and the bias is small noise.
  std::vector<float> router, bias;
  for (const LayerWeights& layer : w.layers) {
    if (layer.experts.empty()) continue;
    const auto r = as_floats(layer.router), b = as_floats(layer.router_bias);
    router.insert(router.end(), r.begin(), r.end());
    bias.insert(bias.end(), b.begin(), b.end());
  }
  EXPECT_NEAR(mean_and_stddev(router).second * 8.0, 1.0, 0.08);  // 1/sqrt(hidden = 64)
  EXPECT_NEAR(mean_and_stddev(bias).second, 0.05, 0.02);
  // Different tensors of the same shape hold different values.
  EXPECT_NE(as_floats(w.layers[2].experts[0].gate_proj.weight), as_floats(w.layers[2].experts[1].gate_proj.weight));
  EXPECT_NE(as_floats(w.layers[2].experts[0].gate_proj.weight), as_floats(w.layers[3].experts[0].gate_proj.weight));
}

TEST_F(MakeModelTest, ShardsWhenOverTheLimit) {
  // tiny in F32 is about 1.6 MB: two files of at most 1 MiB.
  const RunResult result = run_beamline(fmt::format("make-model --preset tiny --dtype f32 --max-shard-mb 1 --out {}", dir_.string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir_ / "model-00002-of-00002.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "model.safetensors"));
  EXPECT_LE(fs::file_size(dir_ / "model-00001-of-00002.safetensors"), (1u << 20) + 65536);
  const BeamWeights weights = load_checkpoint(dir_);
  EXPECT_EQ(weights.archive->files().size(), 2u);
}

struct DryRunTensor {
  std::string dtype, shape;
};

std::map<std::string, DryRunTensor> parse_dry_run(const std::string& output, std::map<std::string, uint64_t>& totals) {
  std::map<std::string, DryRunTensor> tensors;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const auto colon = line.find(": ");
    if (colon != std::string::npos && line.find('[') == std::string::npos) {
      totals[line.substr(0, colon)] = std::stoull(line.substr(colon + 2));
      continue;
    }
    const auto first = line.find(' '), second = line.find(' ', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    tensors[line.substr(0, first)] = {line.substr(first + 1, second - first - 1), line.substr(second + 1)};
  }
  return tensors;
}

// The dry run lists `name` with this dtype and shape.
void expect_tensor(const std::map<std::string, DryRunTensor>& tensors, const std::string& name,
                   const std::string& dtype, const std::string& shape) {
  const auto it = tensors.find(name);
  ASSERT_NE(it, tensors.end()) << name;
  EXPECT_EQ(it->second.dtype, dtype) << name;
  EXPECT_EQ(it->second.shape, shape) << name;
}

TEST_F(MakeModelTest, Beam10DryRunHasTheDocumentedTensors) {
  const RunResult result = run_beamline("make-model --preset beam-1.0 --dry-run");
  ASSERT_EQ(result.exit_code, 0) << result.output.substr(0, 2000);
  std::map<std::string, uint64_t> totals;
  const auto tensors = parse_dry_run(result.output, totals);
  expect_tensor(tensors, "model.embed_tokens.weight", "BF16", "[201088, 5120]");
  expect_tensor(tensors, "lm_head.weight", "BF16", "[201088, 5120]");
  expect_tensor(tensors, "model.norm.weight", "BF16", "[5120]");
  std::set<int> layers, dense_layers, moe_layers;
  std::map<int, std::set<int>> experts;
  const std::string layer_prefix = "model.layers.", expert_infix = "mlp.experts.";
  for (const auto& [name, tensor] : tensors) {
    if (!name.starts_with(layer_prefix)) continue;
    std::size_t digits = 0;
    const int layer = std::stoi(name.substr(layer_prefix.size()), &digits);
    const std::string rest = name.substr(layer_prefix.size() + digits + 1);
    layers.insert(layer);
    if (rest == "mlp.gate_proj.weight") dense_layers.insert(layer);
    if (rest == "mlp.gate.weight") moe_layers.insert(layer);
    if (rest.starts_with(expert_infix)) experts[layer].insert(std::stoi(rest.substr(expert_infix.size())));
  }
  EXPECT_EQ(layers.size(), 52u);
  EXPECT_EQ(*layers.rbegin(), 51);
  EXPECT_EQ(dense_layers, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(moe_layers.size(), 49u);
  EXPECT_EQ(experts.size(), 49u);
  for (const auto& [layer, ids] : experts) {
    EXPECT_EQ(ids.size(), 256u) << layer;
    EXPECT_EQ(*ids.rbegin(), 255);
  }
  for (int layer : {0, 17, 51}) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    expect_tensor(tensors, p + "input_layernorm.weight", "BF16", "[5120]");
    expect_tensor(tensors, p + "post_attention_layernorm.weight", "BF16", "[5120]");
    expect_tensor(tensors, p + "pre_feedforward_layernorm.weight", "BF16", "[5120]");
    expect_tensor(tensors, p + "post_feedforward_layernorm.weight", "BF16", "[5120]");
    expect_tensor(tensors, p + "self_attn.q_proj.weight", "BF16", "[6144, 5120]");
    expect_tensor(tensors, p + "self_attn.k_proj.weight", "BF16", "[1024, 5120]");
    expect_tensor(tensors, p + "self_attn.v_proj.weight", "BF16", "[1024, 5120]");
    expect_tensor(tensors, p + "self_attn.o_proj.weight", "BF16", "[5120, 6144]");
  }
  expect_tensor(tensors, "model.layers.2.mlp.gate_proj.weight", "BF16", "[20480, 5120]");
  expect_tensor(tensors, "model.layers.2.mlp.up_proj.weight", "BF16", "[20480, 5120]");
  expect_tensor(tensors, "model.layers.2.mlp.down_proj.weight", "BF16", "[5120, 20480]");
  expect_tensor(tensors, "model.layers.3.mlp.gate.weight", "F32", "[256, 5120]");
  expect_tensor(tensors, "model.layers.3.mlp.gate.e_score_correction_bias", "F32", "[256]");
  expect_tensor(tensors, "model.layers.51.mlp.experts.255.gate_proj.weight", "BF16", "[2560, 5120]");
  expect_tensor(tensors, "model.layers.51.mlp.experts.255.up_proj.weight", "BF16", "[2560, 5120]");
  expect_tensor(tensors, "model.layers.51.mlp.experts.255.down_proj.weight", "BF16", "[5120, 2560]");
  EXPECT_EQ(tensors.size(), 1 + 52 * 8 + 3 * 3 + 49 * (2 + 256 * 3) + 2u);
  EXPECT_EQ(totals["tensors"], tensors.size());
  // docs/model-format.md: 500.1 B parameters, 22.3 B active per token.
  EXPECT_NEAR(static_cast<double>(totals["parameters"]) / 1e9, 500.1, 0.05);
  EXPECT_NEAR(static_cast<double>(totals["active parameters per token"]) / 1e9, 22.3, 0.05);
  EXPECT_GT(totals["files"], 200u);  // ~1 TB in 4 GiB shards
}

// The full model's bytes per format (docs/quantization.md): projections quantized, lm_head, embeddings, norms and
// the router kept; the parameter count is the unquantized model's.
TEST_F(MakeModelTest, Beam10DryRunQuantized) {
  std::map<std::string, uint64_t> bf16_totals;
  parse_dry_run(run_beamline("make-model --preset beam-1.0 --dry-run").output, bf16_totals);
  for (const std::string format : {"fp8", "nvfp4"}) {
    const RunResult result = run_beamline("make-model --preset beam-1.0 --dry-run --quantization " + format);
    ASSERT_EQ(result.exit_code, 0) << result.output.substr(0, 2000);
    std::map<std::string, uint64_t> totals;
    const auto tensors = parse_dry_run(result.output, totals);
    expect_tensor(tensors, "lm_head.weight", "BF16", "[201088, 5120]");
    expect_tensor(tensors, "model.embed_tokens.weight", "BF16", "[201088, 5120]");
    expect_tensor(tensors, "model.layers.3.mlp.gate.weight", "F32", "[256, 5120]");
    expect_tensor(tensors, "model.layers.0.input_layernorm.weight", "BF16", "[5120]");
    if (format == "fp8") {
      expect_tensor(tensors, "model.layers.0.self_attn.q_proj.weight", "F8_E4M3", "[6144, 5120]");
      expect_tensor(tensors, "model.layers.0.self_attn.q_proj.weight_scale_inv", "F32", "[48, 40]");
      expect_tensor(tensors, "model.layers.9.mlp.experts.7.down_proj.weight_scale_inv", "F32", "[40, 20]");
    } else {
      expect_tensor(tensors, "model.layers.9.mlp.experts.7.down_proj.weight", "U8", "[5120, 1280]");
      expect_tensor(tensors, "model.layers.9.mlp.experts.7.down_proj.weight_scale", "F8_E4M3", "[5120, 160]");
      expect_tensor(tensors, "model.layers.9.mlp.experts.7.down_proj.weight_scale_2", "F32", "[]");
    }
    EXPECT_EQ(totals["parameters"], bf16_totals["parameters"]);
    // fp8: one byte a weight plus 4 bytes per 128x128 block; nvfp4: 4.5 bits a weight; the BF16 embeddings and
    // lm_head (2.06 B parameters each) on top.
    const double ratio = static_cast<double>(totals["bytes"]) / static_cast<double>(bf16_totals["bytes"]);
    EXPECT_NEAR(ratio, format == "fp8" ? 0.504 : 0.289, 0.01) << totals["bytes"];
  }
}

TEST_F(MakeModelTest, QuantizeCommandAndQuantizedMakeModel) {
  const fs::path bf16 = dir_ / "bf16", quantized = dir_ / "mxfp8", random_nvfp4 = dir_ / "nvfp4";
  ASSERT_EQ(run_beamline(fmt::format("make-model --preset tiny --out {}", bf16.string())).exit_code, 0);
  RunResult result = run_beamline(
      fmt::format("quantize --model {} --out {} --quantization mxfp8", bf16.string(), quantized.string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  BeamWeights weights = load_checkpoint(quantized);
  ASSERT_TRUE(weights.config.quantization);
  EXPECT_EQ(weights.config.quantization->quant_method, "mxfp8");
  EXPECT_EQ(weights.config.quantization->ignored_layers, std::vector<std::string>{"lm_head"});
  EXPECT_TRUE(weights.layers[0].q_proj.quantized());
  EXPECT_FALSE(weights.lm_head.quantized());
  EXPECT_TRUE(fs::exists(quantized / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(quantized / "harmony.json"));

  result = run_beamline(
      fmt::format("quantize --model {} --out {} --quantization fp8", quantized.string(), (dir_ / "twice").string()));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("already quantized"), std::string::npos) << result.output;
  result = run_beamline(fmt::format("quantize --model {} --out {}", bf16.string(), (dir_ / "none").string()));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("--quantization"), std::string::npos) << result.output;

  result = run_beamline(fmt::format("make-model --preset tiny --out {} --quantization nvfp4 --modules-to-not-convert none",
                                    random_nvfp4.string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  weights = load_checkpoint(random_nvfp4);
  EXPECT_EQ(weights.config.quantization->quant_algo, "NVFP4");
  EXPECT_TRUE(weights.lm_head.quantized());
  EXPECT_EQ(weights.layers[1].experts[0].down_proj.scale_2.dtype, DType::F32);
}

TEST_F(MakeModelTest, LayersOverrideKeepsDenseLayersAndTheRule) {
  const RunResult result = run_beamline("make-model --preset beam-1.0 --layers 4 --dry-run");
  ASSERT_EQ(result.exit_code, 0) << result.output.substr(0, 2000);
  std::map<std::string, uint64_t> totals;
  const auto tensors = parse_dry_run(result.output, totals);
  EXPECT_TRUE(tensors.contains("model.layers.2.mlp.down_proj.weight"));
  EXPECT_TRUE(tensors.contains("model.layers.3.mlp.experts.255.down_proj.weight"));
  EXPECT_FALSE(tensors.contains("model.layers.4.input_layernorm.weight"));
  EXPECT_EQ(totals["tensors"], 1 + 4 * 8 + 3 * 3 + (2 + 256 * 3) + 2u);
}

TEST_F(MakeModelTest, ConfigFileInputAndErrors) {
  fs::create_directories(dir_);
  ModelConfig config = preset_config("tiny");
  config.num_hidden_layers = 3;
  config.layer_types = default_layer_types(3, 2);
  std::ofstream(dir_ / "in.json") << config.to_json().dump();
  RunResult result = run_beamline(fmt::format("make-model --config {} --out {} --dtype f16", (dir_ / "in.json").string(), (dir_ / "m").string()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const BeamWeights weights = load_checkpoint(dir_ / "m");
  EXPECT_EQ(weights.layers.size(), 3u);
  EXPECT_EQ(weights.embed_tokens.dtype, DType::F16);

  // Non-empty output directory without --force, then with it.
  result = run_beamline(fmt::format("make-model --preset tiny --out {}", (dir_ / "m").string()));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("not empty"), std::string::npos) << result.output;
  result = run_beamline(fmt::format("make-model --preset tiny --out {} --force", (dir_ / "m").string()));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(load_checkpoint(dir_ / "m").layers.size(), 6u);

  config.n_group = 3;
  std::ofstream(dir_ / "bad.json") << config.to_json().dump();
  result = run_beamline(fmt::format("make-model --config {} --out {}", (dir_ / "bad.json").string(), (dir_ / "x").string()));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("key \"n_group\": 3 does not divide n_routed_experts (8)"), std::string::npos) << result.output;

  EXPECT_NE(run_beamline("make-model --preset nope --dry-run").exit_code, 0);
  EXPECT_NE(run_beamline(fmt::format("make-model --preset tiny --config {} --dry-run", (dir_ / "in.json").string())).exit_code, 0);
  result = run_beamline("make-model --dry-run");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("--preset or --config"), std::string::npos) << result.output;
  result = run_beamline("make-model --preset tiny");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("--out"), std::string::npos) << result.output;
  result = run_beamline("make-model --help");
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.output.find("--dry-run"), std::string::npos);
}

}  // namespace
}  // namespace beamline

// LoRA adapters (docs/lora.md) on the tiny MoE model, CPU backend: logits with an adapter on attention, the dense MLP
// and routed experts equal the model with the adapter merged into its weights (W + scale * B A); a slot reused by
// another adapter keeps nothing of the first; in the engine, a mixed batch (two adapters and none) equals each request
// alone, bit for bit, and the prefix cache never hands one adapter's blocks to another; bad adapters are refused
// naming the file and the key or tensor.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/lora_adapter.h"
#include "checkpoint/presets.h"
#include "engine/engine.h"
#include "engine/generation_config.h"
#include "lora_test_support.h"
#include "model/beam_model.h"
#include "model/lora_table.h"
#include "model_test_support.h"
#include "runner/beam_model_runner.h"
#include "runner/sequence_runner.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

std::vector<int32_t> prompt_tokens(int count, uint32_t seed) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < count; ++i) tokens.push_back(static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 500u));
  return tokens;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, double{std::abs(a[i] - b[i])});
  return worst;
}

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = preset_config("tiny");
    weights_ = write_and_load(config_, dir_.path() / "base", 11, DType::F32);
    backend_ = create_backend("cpu");
  }

  // The logits of the model with `spec`'s adapter merged into its weights.
  std::vector<float> merged_logits(const std::map<std::string, AdapterTensors>& written,
                                   const std::vector<int32_t>& tokens, const std::string& label) {
    const std::filesystem::path merged = dir_.path() / ("merged-" + label);
    write_merged_checkpoint(config_, *weights_.archive, written, merged);
    BeamModel model(load_checkpoint(merged), *backend_);
    return lora_logits(model, tokens, -1);
  }

  TempDir dir_{"lora"};
  ModelConfig config_;
  BeamWeights weights_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(LoraTest, AdapterEqualsMergedWeightsOnAttentionDenseMlpAndExperts) {
  for (const bool rslora : {false, true}) {
    RandomAdapter spec = everything_adapter(rslora ? 5 : 3);
    spec.rslora = rslora;
    const std::filesystem::path adapter_dir = dir_.path() / fmt::format("adapter-{}", rslora);
    const auto written = write_random_adapter(spec, *weights_.archive, adapter_dir);
    const std::vector<int32_t> tokens = prompt_tokens(21, 4);

    BeamModel model(weights_, *backend_);
    model.enable_lora(3, 8);
    model.load_lora(2, load_peft_adapter(adapter_dir, config_, 8));
    const std::vector<float> with_adapter = lora_logits(model, tokens, 2);
    const std::vector<float> reference = merged_logits(written, tokens, rslora ? "rs" : "plain");
    const std::vector<float> base = lora_logits(model, tokens, -1);
    // The adapter changes the logits by far more than the merged reference differs from it (float rounding only).
    EXPECT_GT(max_difference(with_adapter, base), 0.05) << "rslora " << rslora;
    EXPECT_LT(max_difference(with_adapter, reference), 2e-4) << "rslora " << rslora;
    // Slots the batch does not use leave the base model exactly as it is without LoRA.
    BeamModel plain(weights_, *backend_);
    EXPECT_EQ(base, lora_logits(plain, tokens, -1));
  }
}

TEST_F(LoraTest, SlotReusedByAnotherAdapterKeepsNothingOfTheFirst) {
  const RandomAdapter first = everything_adapter(7);
  RandomAdapter second;
  second.rank = 2;
  second.alpha = 4.0;
  second.seed = 9;
  second.target_modules = {"v_proj", "down_proj"};
  second.modules = {"model.layers.2.self_attn.v_proj", "model.layers.4.mlp.experts.1.down_proj"};
  write_random_adapter(first, *weights_.archive, dir_.path() / "first");
  const auto written = write_random_adapter(second, *weights_.archive, dir_.path() / "second");
  const std::vector<int32_t> tokens = prompt_tokens(12, 8);

  BeamModel model(weights_, *backend_);
  model.enable_lora(1, 8);
  model.load_lora(0, load_peft_adapter(dir_.path() / "first", config_, 8));
  model.load_lora(0, load_peft_adapter(dir_.path() / "second", config_, 8));
  EXPECT_LT(max_difference(lora_logits(model, tokens, 0), merged_logits(written, tokens, "second")), 2e-4);
}

TEST_F(LoraTest, TrueRankExpertsEqualMergedWeightsAndTakeOnlyTheirRank) {
  const RandomAdapter spec = true_rank_adapter(13);
  const std::filesystem::path adapter_dir = dir_.path() / "true-rank";
  const auto written = write_random_adapter(spec, *weights_.archive, adapter_dir, kTrueRankPatterns);
  const LoraWeights adapter = load_peft_adapter(adapter_dir, config_, 8);
  for (const LoraModule& module : adapter.modules) {
    const std::string name = module.expert >= 0 ? fmt::format("model.layers.{}.mlp.experts.{}.{}", module.layer,
                                                              module.expert, lora_projection_name(module.projection))
                           : module.projection >= LoraProjection::Gate
                               ? fmt::format("model.layers.{}.mlp.{}", module.layer, lora_projection_name(module.projection))
                               : fmt::format("model.layers.{}.self_attn.{}", module.layer,
                                             lora_projection_name(module.projection));
    EXPECT_EQ(module.rank, spec.rank_of(name)) << name;
    // alpha / the module's own rank: 16 / 4 for an expert, as PEFT and Megatron-Bridge scale it.
    EXPECT_DOUBLE_EQ(module.scale, spec.scale_of(name)) << name;
  }
  const std::vector<int32_t> tokens = prompt_tokens(21, 5);
  BeamModel model(weights_, *backend_);
  model.enable_lora(2, 8);
  model.load_lora(1, adapter);
  const std::vector<float> with_adapter = lora_logits(model, tokens, 1);
  const double moved = max_difference(with_adapter, lora_logits(model, tokens, -1));
  const double off = max_difference(with_adapter, merged_logits(written, tokens, "true-rank"));
  EXPECT_GT(moved, 0.05);
  EXPECT_LT(off, 2e-4);
  std::printf("true-rank adapter: logits moved by up to %.3g, off the merged checkpoint's by up to %.3g\n", moved, off);

  // Memory: attention stacked at --max-lora-rank for 2 slots; the MLP at each module's own rank, nothing padded.
  int64_t expected = 0;
  for (const auto& [module, t] : written)
    expected += module.find(".mlp.") != std::string::npos ? t.rank * (t.in + t.out) * 4 : 2 * 8 * (t.in + t.out) * 4;
  EXPECT_EQ(model.lora_bytes(), expected);
  std::printf("true-rank adapter in 2 slots: %lld bytes on the backend\n", static_cast<long long>(model.lora_bytes()));
}

// Backend::moe_lora at true rank equals the same adapters zero-padded to a larger rank: bit for bit where both ranks
// are multiples of 8 (cpu dot's lanes see the same products), to float rounding otherwise.
TEST(LoraTrueRank, MoeLoraAtTrueRankEqualsPaddedComputation) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  constexpr int64_t kExperts = 6, kHidden = 40, kInter = 24, kTopK = 3, kRows = 7, kSlots = 2;
  MoeTensors moe;
  uint64_t key = 100;
  for (int64_t e = 0; e < kExperts; ++e)
    moe.experts.push_back({{backend->random_weight(DType::F32, {kInter, kHidden}, key++, 0, 0.2f)},
                           {backend->random_weight(DType::F32, {kInter, kHidden}, key++, 0, 0.2f)},
                           {backend->random_weight(DType::F32, {kHidden, kInter}, key++, 0, 0.2f)}});
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> h(kRows * kHidden), weights(kRows * kTopK);
  for (float& v : h) v = normal(rng);
  for (float& v : weights) v = std::abs(normal(rng));
  std::vector<int32_t> ids(kRows * kTopK);
  for (int64_t t = 0; t < kRows; ++t)
    for (int64_t j = 0; j < kTopK; ++j) ids[t * kTopK + j] = static_cast<int32_t>((t * 5 + j * 2) % kExperts);
  const std::vector<int32_t> slots = {0, -1, 1, 1, 0, -1, 1};
  const Tensor h_t = backend->upload_f32(h, {kRows, kHidden}), ids_t = backend->upload_i32(ids, {kRows, kTopK});
  const Tensor weights_t = backend->upload_f32(weights, {kRows, kTopK}), slots_t = backend->upload_i32(slots, {kRows});

  for (const auto& [rank, padded] : {std::pair<int64_t, int64_t>{8, 64}, {3, 8}}) {
    // modules[p][slot * experts + e], at `rank` (expert 4 of slot 1 has no adapter) and zero-padded to `padded`.
    std::vector<std::vector<LoraModule>> modules(3), padded_modules(3);
    for (int p = 0; p < 3; ++p) {
      const int64_t in = p == 2 ? kInter : kHidden, out = p == 2 ? kHidden : kInter;
      for (int64_t i = 0; i < kSlots * kExperts; ++i) {
        LoraModule m{.layer = 0, .projection = kLoraProjections[4 + p], .expert = i % kExperts, .rank = rank, .in = in,
                     .out = out};
        for (int64_t k = 0; k < rank * in; ++k) m.a.push_back(0.3f * normal(rng));
        for (int64_t k = 0; k < out * rank; ++k) m.b.push_back(0.1f * normal(rng));
        LoraModule wide = m;
        wide.rank = padded;
        wide.a.resize(static_cast<std::size_t>(padded * in), 0.0f);
        wide.b.assign(static_cast<std::size_t>(out * padded), 0.0f);
        for (int64_t o = 0; o < out; ++o)
          std::copy_n(m.b.begin() + o * rank, rank, wide.b.begin() + o * padded);
        modules[p].push_back(std::move(m));
        padded_modules[p].push_back(std::move(wide));
      }
    }
    auto run = [&](std::vector<std::vector<LoraModule>>& by_projection) {
      std::vector<std::unique_ptr<LoraTableStore>> stores;
      SwigluLora lora;
      LoraTable* tables[] = {&lora.gate, &lora.up, &lora.down};
      for (int p = 0; p < 3; ++p) {
        const LoraModule& first = by_projection[p].front();
        stores.push_back(std::make_unique<LoraTableStore>(*backend, kSlots, kExperts, first.in, first.out));
        for (int32_t slot = 0; slot < kSlots; ++slot) {
          std::vector<const LoraModule*> experts;
          for (int64_t e = 0; e < kExperts; ++e)
            experts.push_back(slot == 1 && e == 4 ? nullptr : &by_projection[p][slot * kExperts + e]);
          stores.back()->load(slot, experts);
        }
        *tables[p] = stores.back()->table();
      }
      lora.row_adapters = slots_t;
      Tensor out = backend->alloc(DType::F32, {kRows, kHidden});
      backend->moe_lora(h_t, ids_t, weights_t, moe, lora, out);
      return backend->download_f32(out);
    };
    const std::vector<float> true_rank = run(modules), padded_rank = run(padded_modules);
    Tensor plain = backend->alloc(DType::F32, {kRows, kHidden});
    backend->moe(h_t, ids_t, weights_t, moe, plain);
    const std::vector<float> base = backend->download_f32(plain);
    EXPECT_GT(max_difference(true_rank, base), 0.05) << "rank " << rank;
    for (int64_t t = 0; t < kRows; ++t) {
      if (slots[t] >= 0) continue;  // rows without an adapter are the plain MoE's, bit for bit
      EXPECT_TRUE(std::equal(base.begin() + t * kHidden, base.begin() + (t + 1) * kHidden,
                             true_rank.begin() + t * kHidden))
          << "row " << t;
    }
    if (rank % 8 == 0 && padded % 8 == 0)
      EXPECT_EQ(true_rank, padded_rank) << "rank " << rank;
    else
      EXPECT_LT(max_difference(true_rank, padded_rank), 1e-5) << "rank " << rank;
    std::printf("moe_lora rank %lld vs padded to %lld: max difference %.3g (LoRA moves the output by %.3g)\n",
                static_cast<long long>(rank), static_cast<long long>(padded), max_difference(true_rank, padded_rank),
                max_difference(true_rank, base));
  }
}

// The error message of loading the adapter `spec` (with `extra` in its config) on a server of --max-lora-rank 8.
std::string load_error(const SafetensorsArchive& base, const ModelConfig& config, const std::filesystem::path& dir,
                       RandomAdapter spec, const nlohmann::json& extra = {}) {
  write_random_adapter(spec, base, dir, extra);
  try {
    load_peft_adapter(dir, config, 8);
  } catch (const Error& error) {
    return error.what();
  }
  return "(loaded)";
}

TEST_F(LoraTest, BadAdaptersAreRefusedNamingFileAndKeyOrTensor) {
  RandomAdapter spec;
  spec.target_modules = {"q_proj", "gate_proj"};
  spec.modules = {"model.layers.1.self_attn.q_proj"};
  const SafetensorsArchive& base = *weights_.archive;
  int case_index = 0;
  auto dir = [&] { return dir_.path() / fmt::format("bad{}", case_index++); };

  RandomAdapter big = spec;
  big.rank = 16;
  std::string message = load_error(base, config_, dir(), big);
  EXPECT_NE(message.find("adapter_config.json: key \"r\": rank 16 exceeds --max-lora-rank 8"), std::string::npos)
      << message;

  message = load_error(base, config_, dir(), spec, {{"target_modules", {"q_proj", "embed_tokens"}}});
  EXPECT_NE(message.find("\"target_modules\""), std::string::npos) << message;
  EXPECT_NE(message.find("embed_tokens"), std::string::npos) << message;

  message = load_error(base, config_, dir(), spec, {{"bias", "all"}});
  EXPECT_NE(message.find("key \"bias\""), std::string::npos) << message;
  message = load_error(base, config_, dir(), spec, {{"use_dora", true}});
  EXPECT_NE(message.find("key \"use_dora\""), std::string::npos) << message;
  // A rank_pattern rank the tensors do not have, above --max-lora-rank, two keys that disagree on one module, a key
  // that is no regular expression.
  message = load_error(base, config_, dir(), spec, {{"rank_pattern", {{"q_proj", 2}}}});
  EXPECT_NE(message.find("q_proj.lora_A.weight\" has shape [4, 64], expected [2, 64] (rank 2 from rank_pattern"),
            std::string::npos)
      << message;
  message = load_error(base, config_, dir(), spec, {{"rank_pattern", {{"q_proj", 9}}}});
  EXPECT_NE(message.find("key \"rank_pattern.q_proj\": rank 9 exceeds --max-lora-rank 8"), std::string::npos)
      << message;
  message = load_error(base, config_, dir(), spec, {{"rank_pattern", {{"q_proj", 4}, {"layers.1.self_attn.q_proj", 2}}}});
  EXPECT_NE(message.find("module \"model.layers.1.self_attn.q_proj\" matches both"), std::string::npos) << message;
  message = load_error(base, config_, dir(), spec, {{"alpha_pattern", {{"q_(proj", 2.0}}}});
  EXPECT_NE(message.find("key \"alpha_pattern.q_(proj\": is not a regular expression"), std::string::npos) << message;

  // A module outside target_modules, an expert of a dense layer, an expert the model lacks.
  for (const char* module : {"model.layers.1.self_attn.v_proj", "model.layers.0.mlp.experts.0.gate_proj",
                             "model.layers.1.mlp.experts.8.gate_proj", "model.layers.1.mlp.gate_proj"}) {
    write_random_adapter(spec, base, dir());
    const std::filesystem::path adapter = dir_.path() / fmt::format("bad{}", case_index - 1);
    // Add the offending tensor pair by rewriting the file with it (shaped like a q_proj's, which is what matters).
    std::vector<TensorSource> tensors;
    tensors.push_back(tensor_from_floats(std::string("base_model.model.") + module + ".lora_A.weight", DType::F32,
                                         {4, 64}, std::vector<float>(4 * 64, 0.1f)));
    tensors.push_back(tensor_from_floats(std::string("base_model.model.") + module + ".lora_B.weight", DType::F32,
                                         {64, 4}, std::vector<float>(64 * 4, 0.1f)));
    write_safetensors(adapter / "adapter_model.safetensors", tensors);
    try {
      load_peft_adapter(adapter, config_, 8);
      ADD_FAILURE() << module << " loaded";
    } catch (const Error& error) {
      message = error.what();
      EXPECT_NE(message.find("adapter_model.safetensors"), std::string::npos) << message;
      EXPECT_NE(message.find(module), std::string::npos) << message;
    }
  }

  // A wrong shape names the tensor, the expected and the found shape; an A without its B names the module.
  {
    write_random_adapter(spec, base, dir());
    const std::filesystem::path adapter = dir_.path() / fmt::format("bad{}", case_index - 1);
    write_safetensors(adapter / "adapter_model.safetensors",
                      {tensor_from_floats("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", DType::F32,
                                          {4, 63}, std::vector<float>(4 * 63, 0.1f))});
    try {
      load_peft_adapter(adapter, config_, 8);
      ADD_FAILURE() << "a wrong shape loaded";
    } catch (const Error& error) {
      message = error.what();
      EXPECT_NE(message.find("q_proj.lora_A.weight\" has shape [4, 63], expected [4, 64]"), std::string::npos)
          << message;
    }
    write_safetensors(adapter / "adapter_model.safetensors",
                      {tensor_from_floats("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", DType::F32,
                                          {4, 64}, std::vector<float>(4 * 64, 0.1f))});
    try {
      load_peft_adapter(adapter, config_, 8);
      ADD_FAILURE() << "an A without its B loaded";
    } catch (const Error& error) {
      message = error.what();
      EXPECT_NE(message.find("has lora_A but no lora_B"), std::string::npos) << message;
    }
    std::filesystem::remove(adapter / "adapter_model.safetensors");
    EXPECT_THROW(load_peft_adapter(adapter, config_, 8), Error);
  }
}

// The engine over the tiny model with --enable-lora: mixed batches and the prefix cache.
class LoraEngineTest : public LoraTest {
 protected:
  std::unique_ptr<Engine> engine(bool async_scheduling) {
    EngineConfig c;
    c.max_model_len = 128;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 40;
    c.kv_cache_memory_bytes = int64_t{8} << 20;
    c.async_scheduling = async_scheduling;
    c.enable_lora = true;
    c.max_loras = 2;
    c.max_lora_rank = 8;
    auto runner = std::make_unique<BeamModelRunner>(weights_, "cpu", c);
    auto e = std::make_unique<Engine>(c, std::move(runner), nullptr, std::vector<TokenId>{});
    e->load_lora_adapter("a1", (dir_.path() / "a1").string());
    e->load_lora_adapter("a2", (dir_.path() / "a2").string());
    return e;
  }
  void write_adapters() {
    write_random_adapter(everything_adapter(21), *weights_.archive, dir_.path() / "a1");
    write_random_adapter(everything_adapter(22), *weights_.archive, dir_.path() / "a2");
  }
  static GenerationRequest request(const std::string& id, const std::string& lora, std::vector<int32_t> prompt) {
    GenerationRequest r;
    r.request_id = id;
    r.lora_name = lora;
    r.prompt = std::move(prompt);
    r.detokenize = false;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 8;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 0;
    return r;
  }
  struct Result {
    std::vector<TokenId> tokens;
    std::vector<float> logprobs;
    int32_t cached_tokens = 0;
  };
  static Result result_of(OutputStream& stream) {
    const RequestOutput output = collect_output(stream);
    EXPECT_FALSE(output.error) << *output.error;
    Result result;
    result.tokens = output.samples.at(0).token_ids;
    for (const TokenLogprob& logprob : output.samples.at(0).logprobs) result.logprobs.push_back(logprob.logprob);
    result.cached_tokens = output.usage.cached_tokens;
    return result;
  }
};

TEST_F(LoraEngineTest, MixedBatchEqualsEachRequestAlone) {
  write_adapters();
  std::vector<GenerationRequest> requests;
  const char* loras[] = {"a1", "", "a2", "a1", "a2", ""};
  for (int i = 0; i < 6; ++i)
    requests.push_back(request(fmt::format("r{}", i), loras[i], prompt_tokens(9 + 7 * i, static_cast<uint32_t>(i))));
  std::map<std::string, Result> alone;
  {
    auto e = engine(false);
    for (const GenerationRequest& r : requests) alone[r.request_id] = result_of(*e->add_request(r));
  }
  auto e = engine(true);
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (const GenerationRequest& r : requests) streams.push_back(e->add_request(r));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Result together = result_of(*streams[i]);
    EXPECT_EQ(together.tokens, alone[requests[i].request_id].tokens) << requests[i].request_id;
    EXPECT_EQ(together.logprobs, alone[requests[i].request_id].logprobs) << requests[i].request_id;
  }
  // The adapters do change the answers (else the comparison above proves little).
  EXPECT_NE(alone["r0"].logprobs, result_of(*e->add_request(request("r0-base", "", requests[0].prompt))).logprobs);
}

TEST_F(LoraEngineTest, PrefixCacheIsKeyedByAdapter) {
  write_adapters();
  auto e = engine(true);
  const std::vector<int32_t> prompt = prompt_tokens(60, 3);
  const Result first = result_of(*e->add_request(request("first", "a1", prompt)));
  const Result same = result_of(*e->add_request(request("same", "a1", prompt)));
  EXPECT_GT(same.cached_tokens, 0);
  EXPECT_EQ(same.logprobs, first.logprobs);
  // Another adapter and the base model compute the prompt themselves and answer as they do on a fresh engine.
  const Result other = result_of(*e->add_request(request("other", "a2", prompt)));
  const Result base = result_of(*e->add_request(request("base", "", prompt)));
  EXPECT_EQ(other.cached_tokens, 0);
  EXPECT_EQ(base.cached_tokens, 0);
  auto fresh = engine(true);
  EXPECT_EQ(other.logprobs, result_of(*fresh->add_request(request("other", "a2", prompt))).logprobs);
  EXPECT_EQ(base.logprobs, result_of(*fresh->add_request(request("base", "", prompt))).logprobs);
}

TEST_F(LoraEngineTest, LoadAndUnloadRules) {
  write_adapters();
  auto e = engine(true);
  auto param_of = [](auto&& call) {
    try {
      call();
    } catch (const InvalidRequest& error) {
      return error.param();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of([&] { e->load_lora_adapter("a1", (dir_.path() / "a2").string()); }), "lora_name");  // name in use
  EXPECT_EQ(param_of([&] { e->load_lora_adapter("a3", (dir_.path() / "a2").string()); }), "lora_name");  // --max-loras
  EXPECT_EQ(param_of([&] { e->unload_lora_adapter("nope"); }), "lora_name");
  EXPECT_EQ(param_of([&] { e->add_request(request("x", "nope", {1, 2, 3})); }), "model");
  e->unload_lora_adapter("a2");
  EXPECT_EQ(param_of([&] { e->load_lora_adapter("a3", (dir_.path() / "missing").string()); }), "lora_path");
  e->load_lora_adapter("a3", (dir_.path() / "a1").string());  // a failed load leaves its slot free
  std::vector<std::string> names;
  for (const Engine::LoraAdapter& adapter : e->lora_adapters()) names.push_back(adapter.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a1", "a3"}));
  // a3 holds a1's adapter in a2's old slot: the same answers as a1.
  const std::vector<int32_t> prompt = prompt_tokens(20, 5);
  EXPECT_EQ(result_of(*e->add_request(request("p1", "a1", prompt))).logprobs,
            result_of(*e->add_request(request("p3", "a3", prompt))).logprobs);
  // An adapter that a request in flight uses stays (the request is held where it is by a pause meanwhile).
  e->pause(PauseMode::Keep);
  const std::shared_ptr<OutputStream> held = e->add_request(request("held", "a3", prompt));
  EXPECT_EQ(param_of([&] { e->unload_lora_adapter("a3"); }), "lora_name");
  e->resume();
  EXPECT_EQ(result_of(*held).logprobs, result_of(*e->add_request(request("p3b", "a3", prompt))).logprobs);
  e->unload_lora_adapter("a3");
  EXPECT_EQ(e->lora_adapters().size(), 1u);
}

}  // namespace
}  // namespace beamline::testing

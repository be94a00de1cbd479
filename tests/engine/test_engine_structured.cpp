// Structured outputs through the engine over the real model (make-model's `tiny`, random weights, CPU backend) at
// temperature 1.0: under each schema every output that ends is valid, checked by a validator written here from the
// schema (nlohmann's parser plus the schema's rules, no grammar code), outputs end only by the grammar's end or by
// max_tokens; without the constraint the same requests almost never give valid JSON (the constraint bites); and the
// async loop, whose constrained rows wait for the token before them, gives the synchronous loop's outputs; and
// jump-forward (forced tokens as drafts) changes no output, sampled or greedy, while saving steps.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <regex>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine_stats_wait.h"
#include "engine/generation_config.h"
#include "runner/beam_model_runner.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace beamline {
namespace {

using nlohmann::json;

bool is_int_in(const json& v, int64_t low, int64_t high) {
  return v.is_number_integer() && v.get<int64_t>() >= low && v.get<int64_t>() <= high;
}
bool has_only(const json& v, std::initializer_list<const char*> keys) {
  if (!v.is_object()) return false;
  for (const auto& [key, value] : v.items())
    if (std::find_if(keys.begin(), keys.end(), [&](const char* k) { return key == k; }) == keys.end()) return false;
  return true;
}
bool short_string(const json& v, std::size_t max_chars) {
  if (!v.is_string()) return false;
  const std::string s = v.get<std::string>();
  std::size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  return chars <= max_chars;
}

struct SchemaCase {
  std::string name;
  std::string schema;
  std::function<bool(const json&)> valid;
};

std::vector<SchemaCase> schema_cases() {
  auto point = [](const json& p) {
    return has_only(p, {"x", "y"}) && p.contains("x") && p.contains("y") && is_int_in(p["x"], -9, 9) &&
           is_int_in(p["y"], -9, 9);
  };
  return {
      {"person", R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "age": {"type": "integer", "minimum": 0, "maximum": 150}, "admin": {"type": "boolean"}},
          "required": ["name", "age"], "additionalProperties": false})",
       [](const json& v) {
         return has_only(v, {"name", "age", "admin"}) && v.contains("name") && short_string(v["name"], 8) &&
                v.contains("age") && is_int_in(v["age"], 0, 150) && (!v.contains("admin") || v["admin"].is_boolean());
       }},
      {"enum and array", R"({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
          "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}},
          "required": ["color", "tags"], "additionalProperties": false})",
       [](const json& v) {
         if (!has_only(v, {"color", "tags"}) || !v.contains("color") || !v.contains("tags")) return false;
         const json& c = v["color"];
         if (!(c == "red" || c == "green" || c == "blue") || !v["tags"].is_array() || v["tags"].size() > 3) return false;
         return std::all_of(v["tags"].begin(), v["tags"].end(), [](const json& t) { return short_string(t, 4); });
       }},
      {"$ref", R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9,
          "maximum": 9}, "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"],
          "additionalProperties": false}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
          "to": {"$ref": "#/$defs/point"}}, "required": ["from", "to"], "additionalProperties": false})",
       [point](const json& v) {
         return has_only(v, {"from", "to"}) && v.contains("from") && v.contains("to") && point(v["from"]) &&
                point(v["to"]);
       }},
      {"pattern", R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
          "ok": {"type": "boolean"}}, "required": ["code", "ok"], "additionalProperties": false})",
       [](const json& v) {
         return has_only(v, {"code", "ok"}) && v.contains("code") && v["code"].is_string() &&
                std::regex_match(v["code"].get<std::string>(), std::regex("[A-Z]{3}-[0-9]{2}")) && v.contains("ok") &&
                v["ok"].is_boolean();
       }},
  };
}

class StructuredTinyModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     fmt::format("beamline-engine-structured-{}", ::getpid()));
    write_random_checkpoint(preset_config("tiny"), *dir_, 11, DType::BF16);
    tokenizer_ = new std::shared_ptr<const Tokenizer>(Tokenizer::from_tokenizer_json(*dir_ / "tokenizer.json"));
    // Before any grammar is compiled: eos is what ends a completed one.
    eos_ = GenerationConfig::load(*dir_, preset_config("tiny")).eos_token_ids;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete tokenizer_;
  }

  static std::unique_ptr<Engine> engine(bool async_scheduling, bool speculative = false, bool jump_forward = true) {
    EngineConfig c;
    c.jump_forward = jump_forward;
    if (speculative) {  // n-gram drafts of up to 4 tokens, cut to what the grammar allows
      c.speculative.method = SpeculativeMethod::Ngram;
      c.speculative.num_speculative_tokens = 4;
      c.speculative.prompt_lookup_min = 1;
      c.speculative.prompt_lookup_max = 3;
    }
    c.max_model_len = 256;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 128;
    c.kv_cache_memory_bytes = 16 << 20;
    c.async_scheduling = async_scheduling;
    auto runner = std::make_unique<BeamModelRunner>(load_checkpoint(*dir_), "cpu", c);
    return std::make_unique<Engine>(c, std::move(runner), *tokenizer_, eos_);
  }

  // `count` requests at temperature 1.0 (seeded), constrained to `grammar` when it is given (every other one only
  // when `mixed`: constrained and free rows in one batch).
  static std::vector<SampleOutput> run(Engine& e, const std::shared_ptr<const CompiledGrammar>& grammar, int count,
                                       int32_t max_tokens, bool mixed = false, float temperature = 1.0f) {
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < count; ++i) {
      GenerationRequest r;
      r.request_id = fmt::format("s{}", next_id_++);  // ids are free again only once the engine has let go
      // Earlier JSON in the prompt gives the n-gram drafter something to propose.
      r.prompt = (*tokenizer_)->encode(fmt::format(R"(Reply in JSON ({}) like {{"color": "red", "tags": ["a"]}}:)", i));
      r.sampling.temperature = temperature;
      r.sampling.seed = 1000 + i;
      r.sampling.max_tokens = max_tokens;
      if (!mixed || i % 2 == 0) r.grammar = grammar;
      streams.push_back(e.add_request(std::move(r)));
    }
    std::vector<SampleOutput> outputs;
    for (auto& stream : streams) {
      RequestOutput o = collect_output(*stream);
      EXPECT_FALSE(o.error) << *o.error;
      outputs.push_back(o.samples.at(0));
    }
    return outputs;
  }

  static inline std::filesystem::path* dir_ = nullptr;
  static inline std::shared_ptr<const Tokenizer>* tokenizer_ = nullptr;
  static inline std::vector<TokenId> eos_;
  static inline int next_id_ = 0;
};

bool parses_and_validates(const SchemaCase& c, const std::string& text) {
  try {
    return c.valid(json::parse(text));
  } catch (const json::exception&) {
    return false;
  }
}

TEST_F(StructuredTinyModel, ConstrainedOutputsAlwaysValidateAndUnconstrainedOnesRarelyDo) {
  auto e = engine(true);
  const auto vocabulary = Vocabulary::from_tokenizer(**tokenizer_);
  constexpr int kRequests = 24;
  for (const SchemaCase& c : schema_cases()) {
    const auto grammar = CompiledGrammar::compile(json_schema_grammar(c.schema), vocabulary, eos_);
    int ended = 0;
    for (const SampleOutput& out : run(*e, grammar, kRequests, 160)) {
      ASSERT_TRUE(out.finish_reason);
      if (*out.finish_reason == FinishReason::Length) {
        // Cut by max_tokens: a prefix the grammar still accepts, never a wrong end.
        EXPECT_EQ(out.token_ids.size(), 160u);
        continue;
      }
      ASSERT_EQ(*out.finish_reason, FinishReason::Stop) << c.name;
      EXPECT_TRUE(std::find(eos_.begin(), eos_.end(), out.token_ids.back()) != eos_.end()) << c.name << ": " << out.text;
      EXPECT_TRUE(parses_and_validates(c, out.text)) << c.name << ": " << out.text;
      ++ended;
    }
    // Most end by the grammar, so the check above has outputs to bite on.
    EXPECT_GE(ended, kRequests * 3 / 4) << c.name;

    int valid_unconstrained = 0;
    for (const SampleOutput& out : run(*e, nullptr, kRequests, 40)) valid_unconstrained += parses_and_validates(c, out.text);
    EXPECT_LE(valid_unconstrained, kRequests / 10) << c.name << ": the constraint should be what makes outputs valid";
  }
}

TEST_F(StructuredTinyModel, AsyncSchedulingGivesTheSynchronousOutputs) {
  const auto vocabulary = Vocabulary::from_tokenizer(**tokenizer_);
  const SchemaCase c = schema_cases()[1];
  const auto grammar = CompiledGrammar::compile(json_schema_grammar(c.schema), vocabulary, eos_);
  auto async_engine = engine(true);
  auto sync_engine = engine(false);
  const auto a = run(*async_engine, grammar, 12, 80, true);
  const auto s = run(*sync_engine, grammar, 12, 80, true);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].token_ids, s[i].token_ids) << i;
    EXPECT_EQ(a[i].finish_reason, s[i].finish_reason) << i;
  }
}

TEST_F(StructuredTinyModel, SpeculativeDraftsStayInsideTheGrammar) {
  // Greedy: drafting changes nothing; sampled: every output still validates.
  const auto vocabulary = Vocabulary::from_tokenizer(**tokenizer_);
  const SchemaCase c = schema_cases()[1];
  const auto grammar = CompiledGrammar::compile(json_schema_grammar(c.schema), vocabulary, eos_);
  auto plain = engine(false);
  auto speculating = engine(false, true);
  const auto greedy_plain = run(*plain, grammar, 8, 80, true, 0.0f);
  const auto greedy_spec = run(*speculating, grammar, 8, 80, true, 0.0f);
  for (std::size_t i = 0; i < greedy_plain.size(); ++i) EXPECT_EQ(greedy_spec[i].token_ids, greedy_plain[i].token_ids) << i;
  for (const SampleOutput& out : run(*speculating, grammar, 16, 120)) {
    if (out.finish_reason == FinishReason::Stop) {
      EXPECT_TRUE(parses_and_validates(c, out.text)) << out.text;
    }
  }
  EXPECT_GT(speculating->stats().spec_decode_num_draft_tokens_total, 0u);
}

TEST_F(StructuredTinyModel, JumpForwardSavesStepsAndChangesNoOutput) {
  const auto vocabulary = Vocabulary::from_tokenizer(**tokenizer_);
  const SchemaCase c = schema_cases()[2];  // $ref: nested objects, so keys and punctuation are forced often
  const auto grammar = CompiledGrammar::compile(json_schema_grammar(c.schema), vocabulary, eos_);
  for (const float temperature : {0.0f, 1.0f}) {
    auto plain = engine(false, false, false);
    auto sync_jumping = engine(false);
    auto async_jumping = engine(true);
    const auto expected = run(*plain, grammar, 8, 120, false, temperature);
    const auto sync_outputs = run(*sync_jumping, grammar, 8, 120, false, temperature);
    const auto async_outputs = run(*async_jumping, grammar, 8, 120, false, temperature);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(sync_outputs[i].token_ids, expected[i].token_ids) << temperature << " " << i;
      EXPECT_EQ(async_outputs[i].token_ids, expected[i].token_ids) << temperature << " " << i;
      if (expected[i].finish_reason == FinishReason::Stop) {
        EXPECT_TRUE(parses_and_validates(c, sync_outputs[i].text)) << sync_outputs[i].text;
      }
    }
    // The last snapshots, taken once each engine is idle (8 requests finished).
    auto finished = [](const EngineStats& s) { return s.requests_finished_total == 8; };
    const EngineStats without = wait_for_stats(*plain, finished), with = wait_for_stats(*sync_jumping, finished),
                      ahead = wait_for_stats(*async_jumping, finished);
    EXPECT_GT(with.jump_forward_accepted_tokens_total, 0u) << temperature;
    EXPECT_LT(with.steps_total, without.steps_total) << temperature;
    EXPECT_LT(ahead.steps_total, without.steps_total) << temperature;
    EXPECT_EQ(without.jump_forward_draft_tokens_total, 0u);
    std::printf("temperature %.1f: %llu steps without jump-forward, %llu with (sync), %llu with (async); forced tokens "
                "drafted %llu, accepted %llu\n",
                temperature, static_cast<unsigned long long>(without.steps_total),
                static_cast<unsigned long long>(with.steps_total), static_cast<unsigned long long>(ahead.steps_total),
                static_cast<unsigned long long>(with.jump_forward_draft_tokens_total),
                static_cast<unsigned long long>(with.jump_forward_accepted_tokens_total));
  }
}

// A runner that says its decode steps replay graphs (the CUDA runner's case; the CPU backend records none).
class GraphReplayingRunner : public BeamModelRunner {
 public:
  using BeamModelRunner::BeamModelRunner;
  bool replays_decode_graphs() const override { return true; }
};

// Jump-forward drafts cost the whole batch where a step with drafts of different lengths loses something: its decode
// graph, or with async scheduling the step launched ahead. There it drafts only when every one of the step's decoding
// sequences is inside forced bytes: one constrained sequence among seven free ones (all decoding in step) decodes one
// token per step, with the outputs of the engine that drafts (synchronous, no graphs); eight constrained ones do draft.
TEST_F(StructuredTinyModel, JumpForwardDraftsOnlyWhenEveryRowIsForcedWhereDraftsCostTheBatch) {
  const auto vocabulary = Vocabulary::from_tokenizer(**tokenizer_);
  const auto grammar = CompiledGrammar::compile(json_schema_grammar(schema_cases()[2].schema), vocabulary, eos_);
  enum class Mode { Sync, Async, SyncGraphs };
  auto run_core = [&](Mode mode, int constrained) {
    EngineConfig c;
    c.async_scheduling = mode == Mode::Async;
    c.max_model_len = 256;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 1024;  // every prompt in the first step, so the eight decode in lockstep
    c.kv_cache_memory_bytes = 16 << 20;
    std::unique_ptr<BeamModelRunner> runner =
        mode == Mode::SyncGraphs ? std::make_unique<GraphReplayingRunner>(load_checkpoint(*dir_), "cpu", c)
                                 : std::make_unique<BeamModelRunner>(load_checkpoint(*dir_), "cpu", c);
    EngineCore core(resolve_engine_config(c, *runner), *runner, tokenizer_->get(), eos_);
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 8; ++i) {
      GenerationRequest r;
      r.request_id = fmt::format("m{}", i);
      r.prompt = (*tokenizer_)->encode(fmt::format(R"(Reply in JSON ({}) like {{"color": "red"}}:)", i));
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 2000 + i;
      r.sampling.max_tokens = 60;
      // The free ones run to max_tokens, so the constrained one never decodes alone.
      r.sampling.ignore_eos = i >= constrained;
      if (i < constrained) r.grammar = grammar;
      streams.push_back(std::make_shared<OutputStream>(r.request_id));
      core.add_request(std::move(r), streams.back());
    }
    while (core.has_work()) core.step();
    std::vector<std::vector<TokenId>> outputs;
    for (auto& stream : streams) outputs.push_back(collect_output(*stream).samples.at(0).token_ids);
    return std::make_pair(outputs, core.stats().jump_forward_draft_tokens_total);
  };
  for (const int constrained : {1, 8}) {
    const auto [expected, sync_drafts] = run_core(Mode::Sync, constrained);
    EXPECT_GT(sync_drafts, 0u) << constrained;
    for (const Mode mode : {Mode::Async, Mode::SyncGraphs}) {
      const auto [outputs, drafts] = run_core(mode, constrained);
      EXPECT_EQ(outputs, expected) << constrained;
      if (constrained == 1) EXPECT_EQ(drafts, 0u);
      else EXPECT_GT(drafts, 0u);
    }
  }
}

}  // namespace
}  // namespace beamline

// beamline generate: prefill a token sequence, then decode token by token through the KV cache; prints the ids.
// With --speculative-config the sequence goes through the serving engine instead (one request), so that speculative
// decoding runs as in `serve`, and the log reports how many draft tokens the target accepted. So does it with
// --harmony-tools, which holds the output to the Harmony template as `serve` holds a chat turn (the checkpoint's
// harmony.json channels, the given tools the only recipients, each call's arguments to its `parameters` schema).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/registry.h"
#include "commands.h"
#include "engine/engine_config.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "harmony/harmony_template.h"
#include "model/beam_model.h"
#include "model/weights.h"
#include "model_options.h"
#include "runner/beam_model_runner.h"
#include "runner/sequence_runner.h"
#include "structured/harmony_constraint.h"
#include "structured/token_mask.h"
#include "tokenizer/tokenizer.h"
#include "token_list.h"
#include "util/error.h"

namespace beamline::cli {
namespace {

struct GenerateOptions {
  ModelSource source;
  std::string tokens, device = "auto", dtype = "auto", kv_cache_dtype = "auto";
  bool calculate_kv_scales = false;
  int64_t max_tokens = 16;
  double temperature = 0.0;
  double top_p = 1.0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  SpeculativeConfig speculative;
  std::optional<std::string> harmony_tools;  // a JSON array of {"name", "parameters"}: the Harmony constraint's tools
};

// The Harmony template constraint of `harmony_template` over the tokenizer, with `tools_json`'s tools (in the
// template's tool namespace) as the only recipients.
std::shared_ptr<const CompiledGrammar> harmony_tools_grammar(const harmony::HarmonyTemplate& harmony_template,
                                                             const Tokenizer& tokenizer, const std::string& tools_json) {
  // ordered_json, as serve parses requests: a schema's `properties` order is the order the grammar holds members to.
  nlohmann::ordered_json tools;
  try {
    tools = nlohmann::ordered_json::parse(tools_json);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(fmt::format("--harmony-tools: not JSON: {}", e.what()));
  }
  require(tools.is_array(), "--harmony-tools: a JSON array of {{\"name\", \"parameters\"}} objects, not {}", tools.dump());
  HarmonyConstraintSpec spec;
  spec.reasoning_channel = harmony_template.reasoning_channel;
  spec.final_channel = harmony_template.final_channel;
  spec.tool_channel = harmony_template.tool_channel;
  spec.tool_namespace = harmony_template.tool_namespace;
  for (const nlohmann::ordered_json& tool : tools) {
    require(tool.is_object() && tool.contains("name") && tool["name"].is_string(),
            "--harmony-tools: each tool needs a string \"name\", got {}", tool.dump());
    HarmonyTool declared{spec.tool_namespace + "." + tool["name"].get<std::string>(), std::nullopt};
    if (tool.contains("parameters") && !tool["parameters"].is_null()) declared.parameters = tool["parameters"].dump();
    spec.tools.push_back(std::move(declared));
  }
  return CompiledGrammar::compile(harmony_grammar(spec), harmony_vocabulary(tokenizer), {});
}

// Greedy (lowest index among equal maxima) at temperature 0; else nucleus sampling over softmax(logits / T).
int32_t sample(std::span<const float> logits, double temperature, double top_p, std::mt19937_64& rng) {
  if (temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probabilities(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) probabilities[i] = std::exp((logits[i] - max_logit) / temperature);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probabilities[a] > probabilities[b]; });
  const double total = std::accumulate(probabilities.begin(), probabilities.end(), 0.0);
  double kept_mass = 0.0;
  std::size_t kept = 0;
  while (kept < order.size() && (kept == 0 || kept_mass < top_p * total)) kept_mass += probabilities[order[kept++]];
  double draw = std::uniform_real_distribution<double>(0.0, kept_mass)(rng);
  for (std::size_t i = 0; i < kept; ++i) {
    draw -= probabilities[order[i]];
    if (draw < 0.0) return order[i];
  }
  return order[kept - 1];
}

// The engine's path: one request through EngineCore over BeamModelRunner (the engine's sampler: greedy is the same
// argmax, sampled outputs draw from the request's seeded stream).
void generate_with_engine(const GenerateOptions& options, const BeamWeights& weights, const std::vector<int32_t>& prompt) {
  const ModelConfig& model = weights.config;
  const auto length = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  EngineConfig config;
  config.max_num_seqs = 1;
  config.max_model_len = length;
  config.dtype = options.dtype;
  config.kv_cache_dtype = options.kv_cache_dtype;
  config.calculate_kv_scales = options.calculate_kv_scales;
  config.async_scheduling = false;
  config.speculative = options.speculative;
  // Room for this one sequence, its drafts and block rounding, as if every layer were full-attention and FP32.
  config.kv_cache_memory_bytes = model.num_hidden_layers * 2 * model.num_key_value_heads * model.head_dim * 4 *
                                 (length + options.speculative.num_speculative_tokens + 4 * 512);
  BeamModelRunner runner(weights, options.device, config);
  std::vector<TokenId> eos(model.eos_token_ids.begin(), model.eos_token_ids.end());
  EngineCore core(resolve_engine_config(config, runner), runner, nullptr, eos);
  GenerationRequest request;
  request.request_id = "generate";
  request.prompt = prompt;
  request.detokenize = false;
  request.sampling.temperature = static_cast<float>(options.temperature);
  request.sampling.top_p = static_cast<float>(options.top_p);
  request.sampling.seed = options.seed;
  request.sampling.max_tokens = static_cast<int32_t>(options.max_tokens);
  request.sampling.ignore_eos = options.ignore_eos;
  if (options.harmony_tools) {  // ends at the template's stop tokens, as a served chat turn
    const auto tokenizer = Tokenizer::from_tokenizer_json(std::filesystem::path(options.source.model) / "tokenizer.json");
    const auto harmony_template = harmony::HarmonyTemplate::for_model(options.source.model);
    request.grammar = harmony_tools_grammar(harmony_template, *tokenizer, *options.harmony_tools);
    request.sampling.stop_token_ids = harmony_template.stop_token_ids(*tokenizer);
  }
  auto stream = std::make_shared<OutputStream>(request.request_id);
  const auto start = std::chrono::steady_clock::now();
  core.add_request(std::move(request), stream);
  while (core.has_work()) core.step();
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  const RequestOutput output = collect_output(*stream);
  require(!output.error, "generate: {}", output.error.value_or(""));
  const std::vector<TokenId>& generated = output.samples.at(0).token_ids;
  std::printf("%s\n", fmt::format("{}", fmt::join(generated, ",")).c_str());
  const EngineStats stats = core.stats();
  const double drafts = static_cast<double>(std::max<uint64_t>(1, stats.spec_decode_num_drafts_total));
  spdlog::info("generated {} tokens in {} engine steps, {:.3f} s on {}", generated.size(), stats.steps_total,
               seconds.count(), options.device);
  spdlog::info("speculative decoding: {} drafts, {} draft tokens, {} accepted; {:.3f} tokens per step with a draft; "
               "accepted per position [{}]",
               stats.spec_decode_num_drafts_total, stats.spec_decode_num_draft_tokens_total,
               stats.spec_decode_num_accepted_tokens_total,
               1.0 + static_cast<double>(stats.spec_decode_num_accepted_tokens_total) / drafts,
               fmt::join(stats.spec_decode_num_accepted_tokens_per_pos, ","));
}

void run_generate(const GenerateOptions& options) {
  require(options.max_tokens >= 1, "--max-tokens: {} must be at least 1", options.max_tokens);
  require(std::isfinite(options.temperature) && options.temperature >= 0.0,
          "--temperature: {} must be a finite number >= 0", options.temperature);
  require(options.top_p > 0.0 && options.top_p <= 1.0, "--top-p: {} must be in (0, 1]", options.top_p);
  check_calculate_kv_scales(options.calculate_kv_scales, options.kv_cache_dtype);
  const BeamWeights weights = options.source.load();
  const ModelConfig& config = weights.config;
  const std::vector<int32_t> prompt = parse_token_list(options.tokens, config.vocab_size, "--tokens");
  if (options.speculative.enabled() || options.harmony_tools) return generate_with_engine(options, weights, prompt);
  std::unique_ptr<Backend> backend = create_backend(options.device);
  backend->set_compute_dtype(parse_compute_dtype(options.dtype, backend->device()));
  BeamModel model(weights, *backend);
  if (options.calculate_kv_scales) model.calculate_kv_scales();
  const auto prompt_length = static_cast<int64_t>(prompt.size());
  SequenceRunner runner(model, prompt_length + options.max_tokens, prompt_length, parse_kv_cache_dtype(options.kv_cache_dtype, backend->compute_dtype()));
  std::mt19937_64 rng(options.seed);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<float> logits = runner.step(prompt, false);
  const auto prefilled = Clock::now();
  std::vector<int32_t> generated;
  for (;;) {
    const int32_t token = sample(logits, options.temperature, options.top_p, rng);
    generated.push_back(token);
    const bool eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), token) !=
                     config.eos_token_ids.end();
    if (static_cast<int64_t>(generated.size()) == options.max_tokens || (eos && !options.ignore_eos)) break;
    logits = runner.step(std::span<const int32_t>(&token, 1), false);
  }
  const std::chrono::duration<double> prefill_time = prefilled - start, decode_time = Clock::now() - prefilled;
  std::printf("%s\n", fmt::format("{}", fmt::join(generated, ",")).c_str());
  spdlog::info("prefill {} tokens in {:.3f} s; decoded {} tokens in {:.3f} s ({:.1f} tokens/s) on {}", prompt_length,
               prefill_time.count(), generated.size() - 1, decode_time.count(),
               generated.size() > 1 ? static_cast<double>(generated.size() - 1) / decode_time.count() : 0.0,
               backend->name());
}

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand(
      "generate", "Prefill a token sequence, decode up to --max-tokens tokens through the KV cache, print their ids");
  add_model_source_options(*command, options->source);
  command->add_option("--tokens", options->tokens, "prompt: comma-separated token ids, e.g. 1,2,3")->required();
  command->add_option("--max-tokens", options->max_tokens, "tokens to generate")->capture_default_str();
  command->add_option("--temperature", options->temperature, "sampling temperature (0 = greedy)")
      ->capture_default_str();
  command->add_option("--top-p", options->top_p, "nucleus sampling mass, in (0, 1]")->capture_default_str();
  command->add_option("--seed", options->seed, "random seed for sampling")->capture_default_str();
  command->add_flag("--ignore-eos", options->ignore_eos, "keep generating after an end-of-sequence token");
  command->add_option("--device", options->device, "auto (cuda where a GPU is present, else cpu), cpu or cuda")->capture_default_str();
  add_dtype_options(*command, options->dtype, options->kv_cache_dtype, options->calculate_kv_scales);
  command
      ->add_option_function<std::string>(
          "--speculative-config",
          [options](const std::string& text) { options->speculative = parse_speculative_config(text); },
          "Speculative decoding as in `serve` (vLLM's JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": "
          "4}'): the sequence runs through the engine, whose sampler this uses, and the log reports acceptance")
      ->type_name("JSON");
  command
      ->add_option_function<std::string>(
          "--harmony-tools", [options](const std::string& text) { options->harmony_tools = text; },
          "Hold the output to the Harmony template as serve holds a chat turn, these tools (a JSON array of "
          "{\"name\", \"parameters\"}, e.g. '[]') the only recipients, each call's arguments to its schema; the "
          "sequence runs through the engine")
      ->type_name("JSON");
  command->callback([options] { run_generate(*options); });
});

}  // namespace
}  // namespace beamline::cli

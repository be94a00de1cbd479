// Issue 16's generation check at scale: a random-weight model (make-model's `tiny`, CPU backend) at temperature 1.0
// under each of the schemas of bench/data/structured_schemas.json, N outputs per schema, all through the engine
// (async scheduling, batches of 64). Writes one JSON line per output ({"schema", "constrained", "finish", "text"})
// for an independent validator: tests/js/validate_structured_outputs.mjs checks every output with ajv. A control
// run without the constraint (`control` outputs per schema) shows the constraint is what makes outputs valid.
// Usage: bench_structured_scale <schemas.json> <outputs.jsonl> [outputs per schema = 1000] [control = 20]
//        [max_tokens = 512] [first schema = 0: from a later one, outputs are appended (a resumed run)]
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "engine/engine.h"
#include "engine/generation_config.h"
#include "runner/beam_model_runner.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace {

using Clock = std::chrono::steady_clock;
using beamline::TokenId;

const char* finish_name(const std::optional<beamline::FinishReason>& reason) {
  if (!reason) return "none";
  switch (*reason) {
    case beamline::FinishReason::Stop: return "stop";
    case beamline::FinishReason::Length: return "length";
    default: return "other";
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace beamline;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <schemas.json> <outputs.jsonl> [per schema] [control] [max_tokens]\n", argv[0]);
    return 2;
  }
  const int per_schema = argc > 3 ? std::atoi(argv[3]) : 1000;
  const int control = argc > 4 ? std::atoi(argv[4]) : 20;
  const int max_tokens = argc > 5 ? std::atoi(argv[5]) : 512;
  const std::size_t first = argc > 6 ? static_cast<std::size_t>(std::atoi(argv[6])) : 0;
  const auto schemas = nlohmann::json::parse(std::ifstream(argv[1]));
  std::ofstream out(argv[2], first > 0 ? std::ios::app : std::ios::trunc);

  const auto dir = std::filesystem::temp_directory_path() / fmt::format("beamline-structured-scale-{}", ::getpid());
  write_random_checkpoint(preset_config("tiny"), dir, 11, DType::BF16);
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::from_tokenizer_json(dir / "tokenizer.json");
  const std::vector<TokenId> eos = GenerationConfig::load(dir, preset_config("tiny")).eos_token_ids;
  EngineConfig config;
  config.max_model_len = max_tokens + 64;
  config.max_num_seqs = 64;
  config.max_num_batched_tokens = 512;
  config.kv_cache_memory_bytes = int64_t{256} << 20;
  config.async_scheduling = true;
  Engine engine(config, std::make_unique<BeamModelRunner>(load_checkpoint(dir), "cpu", config), tokenizer, eos);
  std::filesystem::remove_all(dir);
  const auto vocabulary = Vocabulary::from_tokenizer(*tokenizer);

  int request_id = 0;
  // Submits `count` requests (constrained to `grammar` when given) and writes their outputs; returns the stops.
  auto run = [&](std::size_t schema, const std::shared_ptr<const CompiledGrammar>& grammar, int count) {
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < count; ++i) {
      GenerationRequest r;
      r.request_id = fmt::format("r{}", request_id++);
      r.prompt = tokenizer->encode(fmt::format("Call the tool (schema {}, sample {}) with JSON arguments:", schema, i));
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 1000 + i;
      r.sampling.max_tokens = max_tokens;
      r.grammar = grammar;
      streams.push_back(engine.add_request(std::move(r)));
    }
    int stops = 0;
    for (auto& stream : streams) {
      const RequestOutput o = collect_output(*stream);
      if (o.error) throw Error(*o.error);
      const SampleOutput& s = o.samples.at(0);
      stops += s.finish_reason == FinishReason::Stop;
      out << nlohmann::json{{"schema", schema}, {"constrained", grammar != nullptr}, {"finish", finish_name(s.finish_reason)},
                            {"tokens", s.token_ids.size()}, {"text", s.text}}.dump(-1, ' ', false,
                                                                                   nlohmann::json::error_handler_t::replace)
          << "\n";
    }
    return stops;
  };

  std::printf("| # | schema | compile ms | constrained: stop / length | tokens per output | s |\n| --- | --- | --- | --- | --- | --- |\n");
  const auto start = Clock::now();
  int64_t total_stop = 0, total_length = 0;
  for (std::size_t i = first; i < schemas.size(); ++i) {
    const auto compile_start = Clock::now();
    std::shared_ptr<const CompiledGrammar> grammar;
    try {
      grammar = CompiledGrammar::compile(json_schema_grammar(schemas[i]["schema"].dump()), vocabulary, eos);
    } catch (const UnsupportedGrammar& error) {  // what a server answers with a 400; counted, not generated
      std::printf("| %zu | %s | refused: %s | | | |\n", i, schemas[i]["name"].get<std::string>().c_str(), error.what());
      continue;
    }
    const double compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - compile_start).count();
    const auto run_start = Clock::now();
    const auto tokens_before = engine.stats().generation_tokens_total;
    const int stops = run(i, grammar, per_schema);
    const double seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
    const double tokens = static_cast<double>(engine.stats().generation_tokens_total - tokens_before) / per_schema;
    total_stop += stops;
    total_length += per_schema - stops;
    std::printf("| %zu | %s | %.1f | %d / %d | %.0f | %.1f |\n", i, schemas[i]["name"].get<std::string>().c_str(),
                compile_ms, stops, per_schema - stops, tokens, seconds);
    std::fflush(stdout);
    if (control > 0) run(i, nullptr, control);
    out.flush();  // a schema's outputs are whole on disk before the next one starts (runs can be resumed)
  }
  std::printf("constrained outputs: %lld ended by the grammar, %lld cut by max_tokens (%d); %.0f s in all\n",
              static_cast<long long>(total_stop), static_cast<long long>(total_length), max_tokens,
              std::chrono::duration<double>(Clock::now() - start).count());
  return 0;
}

// Structured-output timings on the o200k_harmony vocabulary (201,088 ids): vocabulary index build, grammar
// compile (grammar + per-state token classification), and the per-token mask while a valid output is fed
// token by token (one mask = one fill of the 32-bit bitmask), pooled over passes; p50 / p99 / max. The Harmony
// cases are whole assistant turns under the template constraint (structured/harmony_constraint.h), with the
// schema as a tool's parameters.
// With a device name (`cpu`, `cuda`) it then times one decode step's mask work at batch 64 (batch_step_masks);
// passes 0 skips the per-case table.
// With --schemas=FILE (bench/data/structured_schemas.json, the scale test's) it compiles every schema of the file on
// o200k, alone and as the one tool of a Harmony turn grammar, and prints the compile CPU time of each. With
// --outputs=FILE too (bench_structured_scale's JSON lines) it also times the per-token mask over the set: up to 20
// constrained outputs per schema that ended by the grammar, re-tokenized canonically by o200k and fed token by token
// (a mask before each token and before the end), per schema and pooled over all schemas.
// --only=NAME,NAME,... restricts both to those schemas of the file.
// With a device and --tokenizer-json=FILE (models/beam-nano/tokenizer.json) the batch-64 step is timed on that
// vocabulary too. Both batch-64 runs end with the rest of the step's host path (batch_step_host_path).
// Usage: bench_structured <o200k_base.tiktoken> [passes] [device] [--schemas=FILE [--outputs=FILE] [--only=NAMES]]
//        [--tokenizer-json=FILE]
//        (scripts/test.sh writes build/testdata/o200k_base.tiktoken)
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <fstream>

#include "backend/registry.h"
#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"
#include "tokenizer/tokenizer.h"
#include "util/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}
// This thread's CPU time in ms: compile figures that other processes on a shared machine do not inflate.
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct Case {
  const char* name;
  const char* schema;  // nullptr: any JSON object (response_format json_object)
  const char* output;  // a valid output in the grammar's form, fed token by token
  bool harmony = false;  // the output is a Harmony turn; `schema` is functions.get_weather's parameters
  int search_max_length = 0;  // > 0: the Harmony request's search tool bounds its query to this many characters
};

constexpr const char* kWeatherArguments = R"({"type":"object","properties":{
        "location":{"type":"string","description":"City and country"},
        "unit":{"type":"string","enum":["celsius","fahrenheit"]},
        "days":{"type":"integer","minimum":1,"maximum":14},
        "when":{"oneOf":[{"type":"string","format":"date"},{"type":"null"}]},
        "include":{"type":"array","items":{"enum":["wind","humidity","uv","pressure"]}}},
        "required":["location","unit"],"additionalProperties":false})";

const Case kCases[] = {
    {"any JSON object", nullptr,
     R"({"id": 1024, "name": "Ada Lovelace", "tags": ["math", "poetry", "engines"], "active": true, "score": 98.5, "address": {"city": "London", "zip": null, "lines": ["12 St James's Square", "Westminster"]}, "notes": "First program, 1843.\nAnalytical Engine."})"},
    {"person with pattern", R"({"type":"object","properties":{
        "name":{"type":"string","minLength":1,"maxLength":64},
        "age":{"type":"integer","minimum":0,"maximum":150},
        "email":{"type":"string","pattern":"^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$"},
        "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
          "country":{"type":"string","enum":["UK","US","FR","DE"]}},"required":["city","country"]},
        "phones":{"type":"array","items":{"type":"string","pattern":"^\\+?[0-9 -]{7,20}$"},"maxItems":4}},
        "required":["name","age","email"],"additionalProperties":false})",
     R"({"name": "Ada Lovelace", "age": 36, "email": "ada.lovelace@example.org", "address": {"street": "12 St James's Square", "city": "London", "country": "UK"}, "phones": ["+44 20 7946 0018", "020 7946 0991"]})"},
    {"email and a path pattern (counted repetitions)", R"({"type":"object","properties":{
        "to":{"type":"string","format":"email"},"path":{"type":"string","pattern":"^/[A-Za-z0-9_./-]{0,40}$"}},
        "required":["to","path"],"additionalProperties":false})",
     R"({"to": "ada.lovelace@analytical-engine.example.org", "path": "/notes/engine_2.md"})"},
    {"tool arguments with enums and oneOf", R"({"type":"object","properties":{
        "location":{"type":"string","description":"City and country"},
        "unit":{"type":"string","enum":["celsius","fahrenheit"]},
        "days":{"type":"integer","minimum":1,"maximum":14},
        "when":{"oneOf":[{"type":"string","format":"date"},{"type":"null"}]},
        "include":{"type":"array","items":{"enum":["wind","humidity","uv","pressure"]}}},
        "required":["location","unit"],"additionalProperties":false})",
     R"({"location": "Paris, France", "unit": "celsius", "days": 5, "when": "2026-12-24", "include": ["wind", "uv"]})"},
    {"Harmony turn: reasoning, then a tool call", kWeatherArguments,
     "<|channel|>analysis<|message|>The user wants the weather in Paris for the next five days, including wind and "
     "UV. I should call get_weather with celsius.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>"
     R"({"location": "Paris, France", "unit": "celsius", "days": 5, "include": ["wind", "uv"]}<|call|>)",
     true},
    {"Harmony turn: reasoning, then the answer", kWeatherArguments,
     "<|channel|>analysis<|message|>Simple arithmetic, no tool needed.<|end|><|start|>assistant<|channel|>final"
     "<|message|>2 + 2 = 4. If you also want the weather, tell me the city.<|return|>",
     true},
    {"counted items: maxItems 1000 of objects", R"({"type":"object","properties":{
        "points":{"type":"array","items":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"},
          "label":{"type":"string","maxLength":300}},"required":["x","y"],"additionalProperties":false},"maxItems":1000}},
        "required":["points"],"additionalProperties":false})",
     R"({"points": [{"x": 1.5, "y": -2}, {"x": 0, "y": 3.25, "label": "origin, shifted"}, {"x": 10, "y": 10}, {"x": -7.5, "y": 0.125, "label": "far left"}, {"x": 2, "y": 2}]})"},
    {"counted items: 2 to 1000 emails", R"({"type":"array","items":{"type":"string","format":"email"},
        "minItems":2,"maxItems":1000})",
     R"(["ada.lovelace@analytical-engine.example.org", "charles@babbage.co.uk", "x_y+z@mail-1.example.com"])"},
    {"Harmony turn: reasoning, then a tool call; search.query maxLength 200", kWeatherArguments,
     "<|channel|>analysis<|message|>The user wants the weather in Paris for the next five days, including wind and "
     "UV. I should call get_weather with celsius.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>"
     R"({"location": "Paris, France", "unit": "celsius", "days": 5, "include": ["wind", "uv"]}<|call|>)",
     true, 200},
};

// The Harmony constraint of a request declaring get_weather (the case's schema) and two more tools.
beamline::Grammar harmony_case_grammar(const char* weather_schema, int search_max_length = 0) {
  beamline::HarmonyConstraintSpec spec;
  spec.tools.push_back({"functions.get_weather", weather_schema});
  spec.tools.push_back({"functions.get_time", R"({"type":"object","properties":{"timezone":{"type":"string"}},"required":["timezone"]})"});
  const std::string query = search_max_length > 0
                                ? R"({"type":"string","maxLength":)" + std::to_string(search_max_length) + "}"
                                : std::string(R"({"type":"string"})");
  spec.tools.push_back({"functions.search", R"({"type":"object","properties":{"query":)" + query +
                                                R"(,"top_n":{"type":"integer","minimum":1,"maximum":10}},"required":["query"]})"});
  return beamline::harmony_grammar(spec);
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

// One decode step's structured-output work at batch 64 on `device`: the host fills 64 rows' masks from matchers
// spread over a Harmony tool-call turn (in parallel over rows, as EngineCore::fill_grammar_masks does), the masks go
// up in one upload and Backend::mask_logits applies them to [64, vocab] logits; Backend::sample on the same rows is
// timed beside it as the step's own sampling cost. Medians of `iterations`, each ended by a synchronize.
// The rest of a step's host work for 64 constrained rows (EngineCore, --jump-forward): which rows are inside forced
// bytes (jump_forward_ahead), their forced tokens (propose_drafts), and each row's mask filled into a vector of its own
// (fill_grammar_masks) and gathered into one upload buffer (StepSampler::apply_token_masks). Medians of `iterations`.
void batch_step_host_path(const std::vector<std::unique_ptr<beamline::GrammarMatcher>>& matchers,
                          const beamline::Tokenizer& tokenizer, int64_t words, int iterations) {
  using namespace beamline;
  std::vector<double> forced_us, tokens_us, fill_us, gather_us;
  std::size_t forced_rows = 0, forced_tokens = 0;
  for (int i = 0; i < iterations + 3; ++i) {
    auto start = Clock::now();
    std::vector<std::size_t> forced;
    for (std::size_t r = 0; r < matchers.size(); ++r)
      if (!matchers[r]->jump_forward_bytes().empty()) forced.push_back(r);
    const double checked = micros_since(start);
    start = Clock::now();
    std::size_t drafted = 0;
    for (const std::size_t r : forced) drafted += matchers[r]->jump_forward_tokens(tokenizer, 16).size();
    const double tokenized = micros_since(start);
    start = Clock::now();
    std::vector<std::vector<uint32_t>> rows(matchers.size());
    ThreadPool::global().parallel_for(matchers.size(), [&](std::size_t begin, std::size_t end) {
      for (std::size_t r = begin; r < end; ++r) {
        rows[r].assign(static_cast<std::size_t>(words), 0u);
        matchers[r]->fill_next_token_mask(rows[r]);
      }
    }, std::max<std::size_t>(1, 65536 / static_cast<std::size_t>(words * 32)));  // the engine's chunks
    const double filled = micros_since(start);
    start = Clock::now();
    std::vector<uint32_t> gathered;
    gathered.reserve(matchers.size() * static_cast<std::size_t>(words));
    for (const std::vector<uint32_t>& row : rows) gathered.insert(gathered.end(), row.begin(), row.end());
    const double gathered_us = micros_since(start);
    if (i < 3) continue;
    forced_rows = forced.size();
    forced_tokens = drafted;
    forced_us.push_back(checked);
    tokens_us.push_back(tokenized);
    fill_us.push_back(filled);
    gather_us.push_back(gathered_us);
  }
  std::printf("host path (CPU, %zu threads): forced-bytes check of %zu rows p50 %.1f µs; forced tokens of the %zu forced "
              "rows (%zu tokens) p50 %.1f µs; masks into per-row vectors p50 %.1f µs, p99 %.1f µs; gathered for the "
              "upload p50 %.1f µs\n",
              ThreadPool::global().size(), matchers.size(), percentile(forced_us, 0.5), forced_rows, forced_tokens,
              percentile(tokens_us, 0.5), percentile(fill_us, 0.5), percentile(fill_us, 0.99), percentile(gather_us, 0.5));
}

void batch_step_masks(const std::string& device, const std::shared_ptr<const beamline::CompiledGrammar>& grammar,
                      const std::vector<beamline::TokenId>& turn, int iterations, const beamline::Tokenizer& tokenizer) {
  using namespace beamline;
  constexpr int64_t kRows = 64;
  const int64_t vocab = grammar->vocabulary()->size(), words = grammar->vocabulary()->mask_words();
  std::vector<std::unique_ptr<GrammarMatcher>> matchers;
  for (int64_t r = 0; r < kRows; ++r) {
    matchers.push_back(std::make_unique<GrammarMatcher>(grammar));
    for (std::size_t i = 0; i < static_cast<std::size_t>(r) * turn.size() / kRows; ++i)
      if (!matchers.back()->accept_token(turn[i])) throw Error("batch_step_masks: the turn left the grammar");
  }
  std::vector<uint32_t> masks(static_cast<std::size_t>(kRows * words));
  auto fill = [&] {
    ThreadPool::global().parallel_for(kRows, [&](std::size_t begin, std::size_t end) {
      for (std::size_t r = begin; r < end; ++r)
        matchers[r]->fill_next_token_mask(std::span<uint32_t>(masks).subspan(r * words, words));
    });
  };
  auto backend = create_backend(device);
  std::vector<float> host_logits(static_cast<std::size_t>(kRows * vocab));
  for (std::size_t i = 0; i < host_logits.size(); ++i) host_logits[i] = static_cast<float>((i * 2654435761u) % 1000) / 100;
  Tensor logits = backend->upload_f32(host_logits, {kRows, vocab});
  std::vector<int32_t> rows(kRows);
  std::vector<SampleRow> settings(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    rows[r] = static_cast<int32_t>(r);
    settings[r].logit_row = static_cast<int32_t>(r);
    settings[r].uniform = (r + 0.5) / kRows;
  }
  SampleOutputs out;
  out.tokens = backend->alloc(DType::I32, {kRows});
  std::vector<double> fill_us, upload_us, apply_us, sample_us;
  for (int i = 0; i < iterations + 3; ++i) {  // the first three warm up (allocations, kernel loads)
    auto start = Clock::now();
    fill();
    const double filled = micros_since(start);
    start = Clock::now();
    const Tensor allowed = backend->upload(masks.data(), DType::I32, {kRows, words});
    backend->synchronize();
    const double uploaded = micros_since(start);
    start = Clock::now();
    backend->mask_logits(logits, rows, allowed);
    backend->synchronize();
    const double applied = micros_since(start);
    start = Clock::now();
    backend->sample(logits, settings, out);
    backend->synchronize();
    const double sampled = micros_since(start);
    if (i < 3) continue;
    fill_us.push_back(filled);
    upload_us.push_back(uploaded);
    apply_us.push_back(applied);
    sample_us.push_back(sampled);
  }
  std::printf("\nbatch 64 on %s, %lld-token vocabulary (%zu host threads): mask fill (host) p50 %.0f µs, p99 %.0f µs; "
              "upload %.2f MB p50 %.0f µs, p99 %.0f µs; mask_logits p50 %.0f µs, p99 %.0f µs; sample (for scale) p50 "
              "%.0f µs\n",
              device.c_str(), static_cast<long long>(vocab), ThreadPool::global().size(), percentile(fill_us, 0.5),
              percentile(fill_us, 0.99), kRows * words * 4 / 1e6, percentile(upload_us, 0.5),
              percentile(upload_us, 0.99), percentile(apply_us, 0.5), percentile(apply_us, 0.99),
              percentile(sample_us, 0.5));
  batch_step_host_path(matchers, tokenizer, words, iterations);
}

// Is the schema named `name` among `only` (comma-separated names; empty: every schema)?
bool selected(const std::string& only, const std::string& name) {
  if (only.empty()) return true;
  for (std::size_t begin = 0; begin <= only.size();) {
    std::size_t end = only.find(',', begin);
    if (end == std::string::npos) end = only.size();
    if (only.compare(begin, end - begin, name) == 0) return true;
    begin = end + 1;
  }
  return false;
}

// Compile CPU ms (median of 3) of each schema in `path`, alone (with eos) and as the only tool of a Harmony turn.
void schema_file_compiles(const std::string& path, const std::string& only, const std::shared_ptr<const beamline::Vocabulary>& plain,
                          const std::shared_ptr<const beamline::Vocabulary>& harmony, beamline::TokenId eos) {
  using namespace beamline;
  std::ifstream in(path);
  const nlohmann::json schemas = nlohmann::json::parse(in);
  auto median_cpu_ms = [](auto&& compile) {
    std::vector<double> ms;
    for (int i = 0; i < 3; ++i) {
      const double start = thread_cpu_ms();
      compile();
      ms.push_back(thread_cpu_ms() - start);
    }
    return percentile(ms, 0.5);
  };
  std::printf("\n| # | schema | compile CPU ms | states | in a Harmony turn: CPU ms | states |\n| --- | --- | --- | --- | --- | --- |\n");
  double worst = 0, worst_harmony = 0;
  for (std::size_t i = 0; i < schemas.size(); ++i) {
    if (!selected(only, schemas[i]["name"].get<std::string>())) continue;
    const std::string schema = schemas[i]["schema"].dump();
    int32_t states = 0, harmony_states = 0;
    const double alone = median_cpu_ms([&] {
      states = CompiledGrammar::compile(json_schema_grammar(schema), plain, {eos})->tables().num_states;
    });
    const double in_turn = median_cpu_ms([&] {
      HarmonyConstraintSpec spec;
      spec.tools.push_back({"functions." + schemas[i]["name"].get<std::string>(), schema});
      harmony_states = CompiledGrammar::compile(harmony_grammar(spec), harmony, {})->tables().num_states;
    });
    worst = std::max(worst, alone);
    worst_harmony = std::max(worst_harmony, in_turn);
    std::printf("| %zu | %s | %.1f | %d | %.1f | %d |\n", i, schemas[i]["name"].get<std::string>().c_str(), alone, states,
                in_turn, harmony_states);
  }
  std::printf("\nslowest compile: %.1f ms alone, %.1f ms in a Harmony turn\n", worst, worst_harmony);
}

// Per-token mask times over the schema set: each schema's first (up to) 20 outputs that ended by the grammar, as
// o200k tokens, through a matcher of the schema alone (eos `end`). A schema none of whose outputs ended (a free `{}`
// payload the random model never closes) is timed over its first 20 cut at max_tokens: prefixes the grammar accepts,
// fed without the end.
void schema_file_masks(const std::string& schemas_path, const std::string& outputs_path, const std::string& only,
                       const beamline::Tokenizer& tokenizer,
                       const std::shared_ptr<const beamline::Vocabulary>& vocabulary, beamline::TokenId end) {
  using namespace beamline;
  constexpr int kPerSchema = 20;
  const nlohmann::json schemas = nlohmann::json::parse(std::ifstream(schemas_path));
  std::vector<std::vector<std::string>> texts(schemas.size()), cut(schemas.size());
  std::ifstream lines(outputs_path);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json o = nlohmann::json::parse(line);
    const auto schema = o["schema"].get<std::size_t>();
    if (schema >= texts.size()) continue;  // a longer set's output
    auto& list = o["finish"] == "stop" ? texts[schema] : cut[schema];
    if (o["constrained"].get<bool>() && list.size() < kPerSchema) list.push_back(o["text"]);
  }
  // Wall time per mask, and the thread's CPU time beside it (a loaded machine preempts some masks; the CPU clock's own
  // call costs ~0.3 µs, so its p50 is not the mask's).
  std::printf("\n| # | schema | outputs | tokens | mask p50 µs | p99 µs | max µs | CPU p99 µs | CPU max µs |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::vector<double> all, all_cpu;
  std::vector<uint32_t> mask(vocabulary->mask_words());
  for (std::size_t i = 0; i < schemas.size(); ++i) {
    if (!selected(only, schemas[i]["name"].get<std::string>())) continue;
    const auto grammar = CompiledGrammar::compile(json_schema_grammar(schemas[i]["schema"].dump()), vocabulary, {end});
    std::vector<double> us, cpu_us;
    const bool ended = !texts[i].empty();
    for (const std::string& text : ended ? texts[i] : cut[i]) {
      GrammarMatcher matcher(grammar);
      std::vector<TokenId> tokens = tokenizer.encode(text);
      if (ended) tokens.push_back(end);
      for (TokenId t : tokens) {
        const double cpu_start = thread_cpu_ms();
        const auto start = Clock::now();
        matcher.fill_next_token_mask(mask);
        us.push_back(micros_since(start));
        cpu_us.push_back((thread_cpu_ms() - cpu_start) * 1e3);
        require(((mask[t >> 5] >> (t & 31)) & 1) && matcher.accept_token(t),
                "schema {} ({}): token {} of an output the grammar accepts is refused", i,
                schemas[i]["name"].get<std::string>(), t);
      }
    }
    all.insert(all.end(), us.begin(), us.end());
    all_cpu.insert(all_cpu.end(), cpu_us.begin(), cpu_us.end());
    if (us.empty()) {
      std::printf("| %zu | %s | 0 | 0 | | | | | |\n", i, schemas[i]["name"].get<std::string>().c_str());
      continue;
    }
    std::printf("| %zu | %s | %zu%s | %zu | %.1f | %.1f | %.1f | %.1f | %.1f |\n", i,
                schemas[i]["name"].get<std::string>().c_str(), ended ? texts[i].size() : cut[i].size(),
                ended ? "" : " cut", us.size(), percentile(us, 0.5),
                percentile(us, 0.99), percentile(us, 1.0), percentile(cpu_us, 0.99), percentile(cpu_us, 1.0));
  }
  if (!all.empty())
    std::printf("\nall %zu masks of the set: wall p50 %.2f µs, p99 %.1f µs, max %.1f µs; thread CPU p99 %.1f µs, max %.1f µs\n",
                all.size(), percentile(all, 0.5), percentile(all, 0.99), percentile(all, 1.0), percentile(all_cpu, 0.99),
                percentile(all_cpu, 1.0));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace beamline;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <o200k_base.tiktoken> [passes]\n", argv[0]);
    return 2;
  }
  std::string schema_file, outputs_file, only, small_tokenizer;
  for (; argc > 2; --argc) {
    const std::string last = argv[argc - 1];
    if (last.rfind("--schemas=", 0) == 0) schema_file = last.substr(10);
    else if (last.rfind("--tokenizer-json=", 0) == 0) small_tokenizer = last.substr(17);
    else if (last.rfind("--outputs=", 0) == 0) outputs_file = last.substr(10);
    else if (last.rfind("--only=", 0) == 0) only = last.substr(7);
    else break;
  }
  int passes = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::string device = argc > 3 ? argv[3] : "";
  auto tokenizer = Tokenizer::from_tiktoken(argv[1], "o200k_harmony");
  auto start = Clock::now();
  auto vocabulary = Vocabulary::from_tokenizer(*tokenizer);
  std::printf("vocabulary: %d ids, %d trie nodes, index built in %.1f ms\n", vocabulary->size(),
              vocabulary->num_nodes(), micros_since(start) / 1000);
  start = Clock::now();
  auto harmony = harmony_vocabulary(*tokenizer);
  std::printf("Harmony vocabulary (special tokens as grammar bytes): index built in %.1f ms\n", micros_since(start) / 1000);
  TokenId end = *tokenizer->token_to_id("<|end|>");
  std::printf("| case | output tokens | compile ms wall (first) | compile CPU ms | front end | rule automata | token classes | states | uncertain entries | mask p50 µs | p99 µs | max µs | accept µs |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Case& c : kCases) {
    if (passes == 0) break;
    // Compile = front end (JSON Schema / Harmony template to a grammar) + rule automata and pushdown tables +
    // per-state token classes, in this thread's CPU time; the middle part is timed again on its own, the last is
    // the rest. Medians of 3.
    std::vector<double> wall_ms, cpu_ms, front_ms, tables_ms;
    std::shared_ptr<const CompiledGrammar> compiled;
    for (int i = 0; i < 3; ++i) {
      start = Clock::now();
      const double cpu_start = thread_cpu_ms();
      Grammar grammar = c.harmony ? harmony_case_grammar(c.schema, c.search_max_length)
                                  : c.schema ? json_schema_grammar(c.schema) : any_json_grammar("object");
      front_ms.push_back(thread_cpu_ms() - cpu_start);
      compiled = CompiledGrammar::compile(grammar, c.harmony ? harmony : vocabulary,
                                          c.harmony ? std::vector<TokenId>{} : std::vector<TokenId>{end});
      cpu_ms.push_back(thread_cpu_ms() - cpu_start);
      wall_ms.push_back(micros_since(start) / 1000);
      const double tables_start = thread_cpu_ms();
      PushdownTables::build(grammar);
      tables_ms.push_back(thread_cpu_ms() - tables_start);
    }
    std::vector<TokenId> tokens = tokenizer->encode(c.output, c.harmony);
    std::vector<uint32_t> mask(vocabulary->mask_words());
    std::vector<double> mask_us, accept_us;
    for (int pass = 0; pass < passes; ++pass) {
      GrammarMatcher matcher(compiled);
      for (TokenId t : tokens) {
        start = Clock::now();
        matcher.fill_next_token_mask(mask);
        mask_us.push_back(micros_since(start));
        if (!((mask[t >> 5] >> (t & 31)) & 1)) {
          std::fprintf(stderr, "%s: token %d '%s' not in the mask\n", c.name, t, std::string(tokenizer->token_bytes(t)).c_str());
          return 1;
        }
        start = Clock::now();
        bool ok = matcher.accept_token(t);
        accept_us.push_back(micros_since(start));
        if (!ok) return 1;
      }
      if (c.harmony) {
        if (!matcher.completed()) {
          std::fprintf(stderr, "%s: the turn did not complete the template\n", c.name);
          return 1;
        }
        continue;
      }
      matcher.fill_next_token_mask(mask);
      if (!((mask[end >> 5] >> (end & 31)) & 1) || !matcher.accept_token(end)) {
        std::fprintf(stderr, "%s: the output did not complete the grammar\n", c.name);
        return 1;
      }
    }
    const double front = percentile(front_ms, 0.5), tables = percentile(tables_ms, 0.5);
    const double cpu = percentile(cpu_ms, 0.5);
    std::printf("| %s | %zu | %.1f (%.1f) | %.1f | %.1f | %.1f | %.1f | %d | %zu | %.1f | %.1f | %.1f | %.2f |\n", c.name,
                tokens.size(), percentile(wall_ms, 0.5), wall_ms[0], cpu, front, tables, cpu - front - tables,
                compiled->tables().num_states,
                compiled->uncertain_total(),
                percentile(mask_us, 0.5), percentile(mask_us, 0.99), percentile(mask_us, 1.0), percentile(accept_us, 0.5));
  }
  if (!schema_file.empty()) schema_file_compiles(schema_file, only, vocabulary, harmony, end);
  if (!schema_file.empty() && !outputs_file.empty()) schema_file_masks(schema_file, outputs_file, only, *tokenizer, vocabulary, end);
  if (!device.empty()) {
    const Case& turn = kCases[4];  // the Harmony tool-call turn
    batch_step_masks(device, CompiledGrammar::compile(harmony_case_grammar(turn.schema), harmony, {}),
                     tokenizer->encode(turn.output, true), 100, *tokenizer);
    if (!small_tokenizer.empty()) {  // the same on a small model's own vocabulary (beam-nano's 4,096 ids)
      const auto small = Tokenizer::from_tokenizer_json(small_tokenizer);
      batch_step_masks(device, CompiledGrammar::compile(harmony_case_grammar(turn.schema), harmony_vocabulary(*small), {}),
                       small->encode(turn.output, true), 100, *small);
    }
  }
  return 0;
}

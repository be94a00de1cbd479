// Structured-output timings on the o200k_harmony vocabulary (201,088 ids): vocabulary index build, grammar
// compile (grammar + per-state token classification), and the per-token mask while a valid output is fed
// token by token (one mask = one fill of the 32-bit bitmask), pooled over passes; p50 / p99 / max. The Harmony
// cases are whole assistant turns under the template constraint (structured/harmony_constraint.h), with the
// schema as a tool's parameters.
// Usage: bench_structured <o200k_base.tiktoken> [passes]   (scripts/test.sh writes build/testdata/o200k_base.tiktoken)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

struct Case {
  const char* name;
  const char* schema;  // nullptr: any JSON object (response_format json_object)
  const char* output;  // a valid output in the grammar's form, fed token by token
  bool harmony = false;  // the output is a Harmony turn; `schema` is functions.get_weather's parameters
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
};

// The Harmony constraint of a request declaring get_weather (the case's schema) and two more tools.
beamline::Grammar harmony_case_grammar(const char* weather_schema) {
  beamline::HarmonyConstraintSpec spec;
  spec.tools.push_back({"functions.get_weather", weather_schema});
  spec.tools.push_back({"functions.get_time", R"({"type":"object","properties":{"timezone":{"type":"string"}},"required":["timezone"]})"});
  spec.tools.push_back({"functions.search", R"({"type":"object","properties":{"query":{"type":"string"},"top_n":{"type":"integer","minimum":1,"maximum":10}},"required":["query"]})"});
  return beamline::harmony_grammar(spec);
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace beamline;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <o200k_base.tiktoken> [passes]\n", argv[0]);
    return 2;
  }
  int passes = argc > 2 ? std::atoi(argv[2]) : 10;
  auto tokenizer = Tokenizer::from_tiktoken(argv[1], "o200k_harmony");
  auto start = Clock::now();
  auto vocabulary = Vocabulary::from_tokenizer(*tokenizer);
  std::printf("vocabulary: %d ids, %d trie nodes, index built in %.1f ms\n", vocabulary->size(),
              vocabulary->num_nodes(), micros_since(start) / 1000);
  start = Clock::now();
  auto harmony = harmony_vocabulary(*tokenizer);
  std::printf("Harmony vocabulary (special tokens as grammar bytes): index built in %.1f ms\n", micros_since(start) / 1000);
  TokenId end = *tokenizer->token_to_id("<|end|>");
  std::printf("| case | output tokens | compile ms (grammar + masks) | states | uncertain entries | mask p50 µs | p99 µs | max µs | accept µs |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Case& c : kCases) {
    std::vector<double> compile_ms;
    std::shared_ptr<const CompiledGrammar> compiled;
    for (int i = 0; i < 3; ++i) {
      start = Clock::now();
      if (c.harmony) {
        compiled = CompiledGrammar::compile(harmony_case_grammar(c.schema), harmony, {});
      } else {
        Grammar grammar = c.schema ? json_schema_grammar(c.schema) : any_json_grammar("object");
        compiled = CompiledGrammar::compile(grammar, vocabulary, {end});
      }
      compile_ms.push_back(micros_since(start) / 1000);
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
    std::printf("| %s | %zu | %.1f (first %.1f) | %d | %zu | %.1f | %.1f | %.1f | %.2f |\n", c.name, tokens.size(),
                percentile(compile_ms, 0.5), compile_ms[0], compiled->tables().num_states, compiled->uncertain_total(),
                percentile(mask_us, 0.5), percentile(mask_us, 0.99), percentile(mask_us, 1.0), percentile(accept_us, 0.5));
  }
  return 0;
}

// Tokenizer throughput (Google Benchmark): o200k_base encode on the benchmark texts, one thread.
// BEAMLINE_TIKTOKEN_RANKS names an o200k_base .tiktoken file and BEAMLINE_TOKENIZER_TEXTS a folder with
// english.txt, code.txt and cjk.txt; bench/tokenizer_vs_js_tiktoken.sh prepares both.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

const beamline::Tokenizer* tokenizer() {
  static const std::unique_ptr<beamline::Tokenizer> loaded = [] {
    const std::string ranks = environment("BEAMLINE_TIKTOKEN_RANKS");
    return ranks.empty() ? nullptr : beamline::Tokenizer::from_tiktoken(ranks, "o200k_base");
  }();
  return loaded.get();
}

std::string read_text(const std::string& name) {
  const std::filesystem::path path = std::filesystem::path(environment("BEAMLINE_TOKENIZER_TEXTS")) / (name + ".txt");
  std::ifstream file(path, std::ios::binary);
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

void encode(benchmark::State& state, const std::string& name) {
  const std::string text = read_text(name);
  if (tokenizer() == nullptr || text.empty()) {
    state.SkipWithError("set BEAMLINE_TIKTOKEN_RANKS and BEAMLINE_TOKENIZER_TEXTS (see bench/tokenizer_vs_js_tiktoken.sh)");
    return;
  }
  std::size_t tokens = 0;
  for (auto _ : state) {
    const std::vector<beamline::TokenId> ids = tokenizer()->encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes"] = static_cast<double>(text.size());
}

void decode(benchmark::State& state) {
  const std::string text = read_text("english");
  if (tokenizer() == nullptr || text.empty()) {
    state.SkipWithError("set BEAMLINE_TIKTOKEN_RANKS and BEAMLINE_TOKENIZER_TEXTS");
    return;
  }
  const std::vector<beamline::TokenId> ids = tokenizer()->encode(text);
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer()->decode_bytes(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void load(benchmark::State& state) {
  const std::string ranks = environment("BEAMLINE_TIKTOKEN_RANKS");
  if (ranks.empty()) {
    state.SkipWithError("set BEAMLINE_TIKTOKEN_RANKS");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(beamline::Tokenizer::from_tiktoken(ranks, "o200k_base"));
}

BENCHMARK_CAPTURE(encode, english, std::string("english"))->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(encode, code, std::string("code"))->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(encode, cjk, std::string("cjk"))->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(decode)->Unit(benchmark::kMillisecond);
BENCHMARK(load)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();

#include "loadgen/datasets.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <fstream>
#include <random>
#include <string>

#include "util/error.h"

namespace beamline::loadgen {

namespace {

constexpr std::array<const char*, 32> kWords = {
    "time",    "person", "year",    "way",   "day",  "thing",  "man",   "world", "life",  "hand",   "part",
    "child",   "eye",    "woman",   "place", "work", "week",   "case",  "point", "river", "city",   "music",
    "garden",  "window", "story",   "light", "market", "voice", "number", "group", "paper", "answer"};

int64_t draw_length(std::mt19937_64& random, int64_t length, double ratio) {
  const auto low = static_cast<int64_t>(std::floor(static_cast<double>(length) * (1.0 - ratio)));
  const auto high = static_cast<int64_t>(std::ceil(static_cast<double>(length) * (1.0 + ratio)));
  return std::max<int64_t>(1, std::uniform_int_distribution<int64_t>(std::max<int64_t>(low, 1), std::max(high, low))(random));
}

std::string random_words(std::mt19937_64& random, int64_t count) {
  std::uniform_int_distribution<std::size_t> word(0, kWords.size() - 1);
  std::string text;
  for (int64_t i = 0; i < count; ++i) {
    if (!text.empty()) text += ' ';
    text += kWords[word(random)];
  }
  return text;
}

}  // namespace

std::vector<BenchSession> multi_turn_dataset(const MultiTurnDatasetOptions& options) {
  require(options.num_sessions >= 1 && options.num_turns >= 1, "--num-sessions and --num-turns must be at least 1");
  require(options.input_len >= 1 && options.output_len >= 1, "--random-input-len and --random-output-len must be at least 1");
  require(options.range_ratio >= 0 && options.range_ratio < 1, "--random-range-ratio must lie in [0, 1) (got {})",
          options.range_ratio);
  std::mt19937_64 random(options.seed);
  std::vector<BenchSession> sessions(static_cast<std::size_t>(options.num_sessions));
  for (BenchSession& session : sessions) {
    for (int64_t turn = 0; turn < options.num_turns; ++turn) {
      session.user_turns.push_back(random_words(random, draw_length(random, options.input_len, options.range_ratio)));
    }
    session.output_len = draw_length(random, options.output_len, options.range_ratio);
  }
  return sessions;
}

std::vector<BenchRequest> random_dataset(const RandomDatasetOptions& options, ApiKind kind) {
  require(options.num_prompts >= 1, "--num-prompts must be at least 1 (got {})", options.num_prompts);
  require(options.input_len >= 1 && options.output_len >= 1, "--random-input-len and --random-output-len must be at least 1");
  require(options.range_ratio >= 0 && options.range_ratio < 1, "--random-range-ratio must lie in [0, 1) (got {})",
          options.range_ratio);
  require(options.prefix_len >= 0, "--random-prefix-len must not be negative");
  require(0 <= options.token_id_low && options.token_id_low <= options.token_id_high,
          "--random-token-id-range: {}-{} is not a range of token ids", options.token_id_low, options.token_id_high);
  std::mt19937_64 random(options.seed);
  std::uniform_int_distribution<int64_t> token(options.token_id_low, options.token_id_high);
  const auto draw_tokens = [&](int64_t count) {
    std::vector<int64_t> ids(static_cast<std::size_t>(count));
    for (int64_t& id : ids) id = token(random);
    return ids;
  };
  const std::vector<int64_t> prefix = draw_tokens(options.prefix_len);
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < options.num_prompts; ++i) {
    std::vector<int64_t> ids = prefix;
    const std::vector<int64_t> own = draw_tokens(draw_length(random, options.input_len, options.range_ratio));
    ids.insert(ids.end(), own.begin(), own.end());
    BenchRequest request;
    request.prompt_len = static_cast<int64_t>(ids.size());
    request.output_len = draw_length(random, options.output_len, options.range_ratio);
    if (kind == ApiKind::Completions) {
      request.prompt = ids;
    } else {
      std::string text;
      for (int64_t id : ids) {
        if (!text.empty()) text += ' ';
        text += kWords[static_cast<std::size_t>(id) % kWords.size()];
      }
      request.prompt = text;
    }
    requests.push_back(std::move(request));
  }
  return requests;
}

std::vector<BenchRequest> custom_dataset(const std::filesystem::path& path, int64_t num_prompts, int64_t output_len) {
  require(output_len >= 1, "--custom-output-len must be at least 1 (got {})", output_len);
  std::ifstream file(path);
  require(file.good(), "--dataset-path {}: cannot open it", path.string());
  std::vector<BenchRequest> requests;
  std::string line;
  for (int64_t number = 1; std::getline(file, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    require(!entry.is_discarded(), "{}:{}: not JSON", path.string(), number);
    require(entry.is_object() && entry.contains("prompt") && entry["prompt"].is_string(),
            "{}:{}: expected an object with a string \"prompt\"", path.string(), number);
    BenchRequest request;
    request.prompt = entry["prompt"];
    request.output_len = output_len;
    requests.push_back(std::move(request));
    if (num_prompts > 0 && static_cast<int64_t>(requests.size()) == num_prompts) break;
  }
  require(!requests.empty(), "--dataset-path {}: no prompts in it", path.string());
  return requests;
}

}  // namespace beamline::loadgen

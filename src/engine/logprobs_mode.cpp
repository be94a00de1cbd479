#include "engine/logprobs_mode.h"

#include <array>
#include <utility>

#include "util/error.h"

namespace beamline {
namespace {

constexpr std::array<std::pair<LogprobsMode, std::string_view>, 4> kNames{{
    {LogprobsMode::RawLogprobs, "raw_logprobs"},
    {LogprobsMode::ProcessedLogprobs, "processed_logprobs"},
    {LogprobsMode::RawLogits, "raw_logits"},
    {LogprobsMode::ProcessedLogits, "processed_logits"},
}};

}  // namespace

LogprobsMode parse_logprobs_mode(std::string_view text) {
  for (const auto& [mode, name] : kNames) {
    if (name == text) return mode;
  }
  fail("--logprobs-mode: '{}' is not one of raw_logprobs, processed_logprobs, raw_logits, processed_logits", text);
}

std::string_view to_string(LogprobsMode mode) {
  for (const auto& [candidate, name] : kNames) {
    if (candidate == mode) return name;
  }
  return "raw_logprobs";
}

}  // namespace beamline

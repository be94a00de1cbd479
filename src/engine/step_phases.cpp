#include "engine/step_phases.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

namespace beamline {

std::unique_ptr<StepPhases> StepPhases::from_environment() {
  const char* value = std::getenv("BEAMLINE_STEP_PHASES");
  if (value == nullptr || std::string_view(value) != "1") return nullptr;
  return std::make_unique<StepPhases>();
}

void StepPhases::begin_step() {
  last_ = Clock::now();
  step_.fill(0.0);
}

void StepPhases::mark(Phase phase) {
  const Clock::time_point now = Clock::now();
  step_[static_cast<std::size_t>(phase)] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

void StepPhases::end_step(Kind kind, int64_t tokens) {
  Totals& totals = kinds_[static_cast<std::size_t>(kind)];
  ++totals.steps;
  totals.tokens += tokens;
  for (std::size_t p = 0; p < kPhases; ++p) totals.seconds[p] += step_[p];
}

std::string StepPhases::table() const {
  std::string out =
      "step phases (host wall ms per step; BEAMLINE_STEP_PHASES)\n"
      "| step | steps | tokens per step | propose (drafter pass + wait) | schedule | launch (forward + sample "
      "enqueue) | wait (device + token download) | emit (settle, stop checks, detokenize) | commit (drafter context) "
      "| step | per token |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    const Totals& totals = kinds_[k];
    if (totals.steps == 0) continue;
    const auto steps = static_cast<double>(totals.steps);
    static constexpr std::array<const char*, kKinds> kNames = {"plain", "plain, prompt rows", "drafted",
                                                               "drafted, prompt rows"};
    out += fmt::format("| {} | {} | {:.2f} |", kNames[k], totals.steps,
                       static_cast<double>(totals.tokens) / steps);
    double all = 0.0;
    for (const double seconds : totals.seconds) {
      out += fmt::format(" {:.3f} |", 1e3 * seconds / steps);
      all += seconds;
    }
    out += fmt::format(" {:.3f} | {:.3f} |\n", 1e3 * all / steps,
                       totals.tokens > 0 ? 1e3 * all / static_cast<double>(totals.tokens) : 0.0);
  }
  return out;
}

}  // namespace beamline

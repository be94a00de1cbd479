#pragma once
// Host wall time per phase of the engine's steps, by kind of step, for BEAMLINE_STEP_PHASES=1: what a step with drafts
// costs against a plain one, phase by phase (docs/speculative-decoding.md, "Cost of a drafted step"). The table goes
// to the log when the engine closes. A phase that waits for the device (proposing with a drafter: its pass; waiting
// for the sampled tokens: the forward) counts the device's time as well; BEAMLINE_CUDA_OP_TIMES splits that by op. The
// drafter-context commit is enqueued right after the step's launch (while the device runs the forward) and counts as
// "commit", with the rejected drafts' truncation after the tokens. With --async-scheduling the next step is launched
// before this one is finished: its launch and commit count as this step's.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace beamline {

class StepPhases {
 public:
  enum class Phase { Propose, Schedule, Launch, Wait, Emit, Commit };
  static constexpr std::size_t kPhases = 6;
  // Drafted: the step verifies drafts. "With prompt rows": it also carries a prompt chunk (or a recomputation), so on
  // a runner with decode graphs it ran op by op.
  enum class Kind { Plain, PlainWithPromptRows, Drafted, DraftedWithPromptRows };
  static constexpr std::size_t kKinds = 4;
  static Kind kind(bool drafted, bool prompt_rows) {
    if (drafted) return prompt_rows ? Kind::DraftedWithPromptRows : Kind::Drafted;
    return prompt_rows ? Kind::PlainWithPromptRows : Kind::Plain;
  }

  // Null unless BEAMLINE_STEP_PHASES=1.
  static std::unique_ptr<StepPhases> from_environment();

  void begin_step();
  // The time since the previous mark (or begin_step) goes to `phase`.
  void mark(Phase phase);
  // The step's phases go to `kind`; `tokens`: the output tokens it emitted.
  void end_step(Kind kind, int64_t tokens);
  // Markdown: per kind, steps, tokens per step and mean milliseconds per step of each phase and in all.
  std::string table() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Totals {
    int64_t steps = 0, tokens = 0;
    std::array<double, kPhases> seconds{};
  };
  Clock::time_point last_;
  std::array<double, kPhases> step_{};
  std::array<Totals, kKinds> kinds_{};
};

}  // namespace beamline

#pragma once
// --speculative-config, vLLM's flag and JSON: '{"method": "ngram", "num_speculative_tokens": K,
// "prompt_lookup_min": a, "prompt_lookup_max": b}', '{"method": "dflash", "model": DIR, ...}', or "none".
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace beamline {

enum class SpeculativeMethod { None, Ngram, DFlash };

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::None;
  int32_t num_speculative_tokens = 0;  // K: draft tokens per sequence and step
  int32_t prompt_lookup_min = 0;       // ngram: shortest suffix n-gram looked up in the context
  int32_t prompt_lookup_max = 0;       // ngram: longest (tried first)
  std::string model;                   // dflash: the drafter's checkpoint directory
  // "adaptive_verification" (beamline's key, default true): each step verifies only the drafts that pay for their
  // cost, possibly none (spec/adaptive_verification.h); false: every sequence verifies all K drafts it gets.
  bool adaptive_verification = true;
  bool given = false;                  // set by parse_speculative_config (also for "none"): the user chose

  // Test hook, never set outside tests: replaces the acceptance probability of a sampled draft token (the exact rule
  // is p_target(token) for a point-mass draft) so a test can show that a biased rule is caught.
  std::function<double(double p_target)> acceptance_for_testing;
  // Test hook, never set outside tests: the seconds adaptive verification records for a step without prompt rows of
  // `decoding` sequences verifying `draft_tokens` drafts (`drafter_ran`: drafts were proposed for it), instead of its
  // wall time, so that a test can state the step costs the choice sees.
  std::function<double(int32_t decoding, int32_t draft_tokens, bool drafter_ran)> step_seconds_for_testing;

  bool enabled() const { return method != SpeculativeMethod::None; }
};

// Parses the flag's value; throws Error naming --speculative-config and the key of the first bad value. "none" (or an
// empty string) turns speculation off. "dflash" is parsed here; the model runner loads and checks the drafter
// (checkpoint/drafter_checkpoint.h) and runs it (spec/block_drafter.h).
SpeculativeConfig parse_speculative_config(std::string_view text);

}  // namespace beamline

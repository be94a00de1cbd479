#pragma once
// One token sequence as the scheduler sees it: a prompt plus generated tokens, and how much of it is in the
// KV cache. A request with n samples has n sequences.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "tokenizer/tokenizer.h"

namespace beamline {

struct Sequence {
  kv::SeqId id = 0;                  // unique and increasing with arrival: the FCFS order
  std::vector<TokenId> tokens;       // prompt, then generated tokens
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;   // positions whose K/V are in the cache
  std::string cache_salt;            // the prefix-cache key: the request's cache_salt and LoRA adapter
  int32_t lora_slot = -1;            // the LoRA adapter's slot its rows use (SequenceSlice::lora_slot)
  // n > 1 with prefix caching: admitted only after this sibling has computed (and cached) the prompt, so
  // the samples share the prompt's blocks instead of each computing them.
  const Sequence* prompt_leader = nullptr;
  bool prompt_computed = false;      // stays true across preemption
  bool admitted = false;             // scheduled at least once
  int32_t num_cached_tokens = 0;     // prompt tokens found in the prefix cache at first admission
  int32_t num_preemptions = 0;
  // Speculative decoding: the last num_draft_tokens of `tokens` are proposed, not yet verified. They live for one
  // step: the scheduler schedules them with the last real token (or drops them), the engine settles them after it.
  int32_t num_draft_tokens = 0;
  // Its prompt must go through the model (routing replay, prompt logprobs): the scheduler never reads it from the
  // prefix cache, on any admission (vLLM skips the lookup for prompt_logprobs). Its blocks are still published.
  bool skip_prefix_cache = false;
  // prompt_logprobs: until the prompt is computed, its steps also ask for the logits of every prompt position but the
  // last (ScheduledSequence::prompt_logit_index).
  bool prompt_logprobs = false;

  std::span<const int32_t> token_span() const { return tokens; }
  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_draft_tokens - num_prompt_tokens; }
};

}  // namespace beamline

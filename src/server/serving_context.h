#pragma once
// What every endpoint needs: the engines (one per data-parallel replica, behind one client), the tokenizer, the checkpoint's Harmony template, the served name.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine_client.h"
#include "engine/generation_config.h"
#include "harmony/harmony_template.h"
#include "structured/grammar_cache.h"

namespace beamline::server {

struct ServingContext {
  EngineClient& engine;
  const Tokenizer& tokenizer;
  harmony::HarmonyTemplate harmony_template;
  std::vector<TokenId> harmony_stop_ids;  // the template's stop tokens: end of an assistant turn
  GenerationConfig generation_config;     // the checkpoint's sampling defaults for fields a request leaves out
  std::string model_name;
  int64_t created = 0;                    // unix seconds the server started (GET /v1/models)
  GrammarCache* grammars = nullptr;       // structured outputs' compiled grammars (server/structured_outputs)
  bool harmony_constraint = true;         // hold every chat turn to the Harmony template (--no-harmony-constraint)
};

// The response field that reports the served weights' version (SGLang's name, in its meta_info): set by
// /update_weights_from_disk, "0" for the weights the server started with.
inline constexpr const char* kWeightVersionField = "weight_version";

// "<prefix>-" followed by 32 random hex digits (response ids: chatcmpl-..., cmpl-...).
std::string new_response_id(const std::string& prefix);
int64_t unix_seconds_now();

}  // namespace beamline::server

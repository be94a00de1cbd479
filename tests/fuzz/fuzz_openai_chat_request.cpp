// Fuzzes the OpenAI request mapping on random JSON: the body text as the HTTP handler receives it (request_fields'
// parse_body; the HTTP framing itself is cpp-httplib's), then what plan_chat_completion does before it needs an
// engine: model check, unsupported fields, stream options, sampling fields (chat, or completions when the first byte
// is odd), messages + tools + reasoning_effort → Harmony conversation → rendered prompt → token ids. Every rejection
// must be a beamline::Error that maps to a 4xx, never a 500 (which is what an escaping nlohmann exception becomes).
#include <cstdlib>

#include "engine/generation_config.h"
#include "fuzz_support.h"
#include "harmony/harmony_fake_tokenizer.h"
#include "harmony/harmony_render.h"
#include "server/api_error.h"
#include "server/openai_mapping.h"
#include "server/openai_sampling.h"
#include "server/request_fields.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace beamline;
  static const harmony::testing::ByteTokenizer tokenizer;
  static const harmony::HarmonyTemplate harmony_template = [] {
    harmony::HarmonyTemplate t;
    t.model_identity = "You are Beam.";
    t.knowledge_cutoff = "2026-06";
    return t;
  }();
  const server::Endpoint endpoint =
      size > 0 && (data[0] & 1) != 0 ? server::Endpoint::Completions : server::Endpoint::ChatCompletions;
  try {
    const server::Json body = server::parse_body(std::string(fuzz::as_text(data, size)));
    server::check_model(body, "beam");
    server::reject_unsupported_fields(body, endpoint);
    (void)server::read_stream_options(body);
    (void)server::read_sampling_params(body, endpoint, /*max_logprobs=*/20, GenerationConfig{});
    const harmony::Conversation conversation =
        harmony::conversation_from_chat_request(body, harmony_template, "2026-12-02");
    const harmony::Pieces pieces =
        harmony::render_for_completion(conversation, harmony::Role::Assistant, harmony_template.render_options());
    (void)harmony::pieces_to_ids(pieces, tokenizer);
  } catch (const Error&) {
    if (server::to_api_error(std::current_exception()).status() >= 500) std::abort();
  }
  return 0;
}

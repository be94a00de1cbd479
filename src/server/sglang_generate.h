#pragma once
// SGLang's native POST /generate, for RL frameworks that speak it: `input_ids` (or `text`), one prompt or a batch,
// `sampling_params` with SGLang's names, `return_logprob` + `top_logprobs_num`; answers `text`, `output_ids` and
// `meta_info` (id, finish_reason, token counts, weight_version, output_token_logprobs), a list for a batch.
#include <vector>

#include "engine/request.h"
#include "engine/request_output.h"
#include "server/api_error.h"
#include "server/serving_context.h"

namespace beamline::server {

struct GeneratePlan {
  std::vector<GenerationRequest> requests;  // one per prompt (ids are set by the caller)
  bool batch = false;                       // the prompt was a list of prompts: the answer is a list
  bool return_logprob = false;
};

GeneratePlan plan_generate(const Json& body, const ServingContext& context);

// `outputs`: the requests' whole outputs, in order. Each sample is one answer (prompt-major, as SGLang's n > 1).
Json generate_response(const ServingContext& context, const GeneratePlan& plan, const std::vector<RequestOutput>& outputs);

}  // namespace beamline::server

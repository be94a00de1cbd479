#pragma once
// vLLM's LoRA endpoints (docs/lora.md): POST /v1/load_lora_adapter and /v1/unload_lora_adapter, and the adapters'
// entries in GET /v1/models.
#include <string>

#include "server/api_error.h"
#include "server/serving_context.h"

namespace beamline::server {

// {"lora_name", "lora_path"}: loads the PEFT adapter (Engine::load_lora_adapter). vLLM's answer text on success; 400
// naming the field otherwise (LoRA off, a name in use, no free slot, a bad adapter: the file and key or tensor).
std::string load_lora_adapter(const Json& body, const ServingContext& context);
// {"lora_name"}: 404 for an adapter that is not loaded, 400 while requests in flight use it.
std::string unload_lora_adapter(const Json& body, const ServingContext& context);
// check_model (openai_sampling.h) against the context's served name and the engine's loaded adapters: the adapter the
// request's `model` names, "" for the base model.
std::string requested_model_lora(const Json& body, const ServingContext& context);
// One /v1/models entry per loaded adapter: id its name, root its path, parent the served model.
Json lora_model_cards(const ServingContext& context);

}  // namespace beamline::server

#include "server/lora_endpoints.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/openai_sampling.h"
#include "server/request_fields.h"

namespace beamline::server {
namespace {

std::string required_name(const Json& body, const char* field) {
  std::optional<std::string> value = optional_string(body, field);
  if (!value || value->empty()) throw invalid_request(field, fmt::format("{}: required (a non-empty string)", field));
  return *value;
}

}  // namespace

std::string requested_model_lora(const Json& body, const ServingContext& context) {
  std::vector<std::string> names;
  for (const Engine::LoraAdapter& adapter : context.engine.lora_adapters()) names.push_back(adapter.name);
  return check_model(body, context.model_name, names);
}

std::string load_lora_adapter(const Json& body, const ServingContext& context) {
  const std::string name = required_name(body, "lora_name"), path = required_name(body, "lora_path");
  if (name == context.model_name)
    throw invalid_request("lora_name", fmt::format("'{}' is the served model's name", name));
  context.engine.load_lora_adapter(name, path);
  return fmt::format("Success: LoRA adapter '{}' added successfully.", name);
}

std::string unload_lora_adapter(const Json& body, const ServingContext& context) {
  const std::string name = required_name(body, "lora_name");
  const auto adapters = context.engine.lora_adapters();
  if (std::none_of(adapters.begin(), adapters.end(), [&](const Engine::LoraAdapter& a) { return a.name == name; }))
    throw ApiError(404, "NotFoundError", fmt::format("The lora adapter '{}' cannot be found.", name), "lora_name");
  context.engine.unload_lora_adapter(name);
  return fmt::format("Success: LoRA adapter '{}' removed successfully.", name);
}

Json lora_model_cards(const ServingContext& context) {
  Json cards = Json::array();
  for (const Engine::LoraAdapter& adapter : context.engine.lora_adapters())
    cards.push_back({{"id", adapter.name},
                     {"object", "model"},
                     {"created", context.created},
                     {"owned_by", "beamline"},
                     {"root", adapter.path},
                     {"parent", context.model_name},
                     {"max_model_len", context.engine.config().max_model_len}});
  return cards;
}

}  // namespace beamline::server

#include "server/structured_outputs.h"

#include <fmt/format.h>

#include <functional>
#include <optional>

#include "server/request_fields.h"
#include "structured/ebnf.h"
#include "structured/harmony_constraint.h"
#include "structured/json_schema.h"

namespace beamline::server {
namespace {

// A requested output format: the cache key (everything the grammar depends on) and how to build it. `field` names
// where it came from, for errors.
struct RequestedFormat {
  std::string field;
  std::string key;
  std::function<Grammar()> build;
};

// vLLM's structured_outputs keys that change nothing here (no fallback backend; the JSON grammars allow no free
// whitespace anyway).
bool ignorable_structured_key(const std::string& key) {
  return key == "disable_fallback" || key == "disable_any_whitespace";
}

std::string schema_text(const Json& schema, const std::string& field) {
  if (schema.is_string()) return schema.get<std::string>();  // vLLM accepts the schema as JSON text too
  if (!schema.is_object() && !schema.is_boolean())
    throw invalid_request(field, fmt::format("{}: expected a JSON Schema object, got {}", field, schema.type_name()));
  return schema.dump();
}

std::optional<RequestedFormat> read_response_format(const Json& body) {
  const Json* format = find_field(body, "response_format");
  if (format == nullptr || format->is_null()) return std::nullopt;
  if (!format->is_object()) throw invalid_request("response_format", "response_format: expected an object with a type");
  const std::string type = optional_string(*format, "type").value_or("");
  if (type == "text") return std::nullopt;
  if (type == "json_object") return RequestedFormat{"response_format", "json_object", [] { return any_json_grammar("object"); }};
  if (type != "json_schema") {
    throw invalid_request("response_format.type", fmt::format("response_format.type: '{}' is not one of 'text', "
                                                              "'json_object', 'json_schema'",
                                                              type));
  }
  const Json* json_schema = find_field(*format, "json_schema");
  if (json_schema == nullptr || !json_schema->is_object())
    throw invalid_request("response_format.json_schema", "response_format.json_schema: missing (an object with a schema)");
  const Json* schema = find_field(*json_schema, "schema");
  // OpenAI allows a json_schema without a schema: any JSON object then.
  if (schema == nullptr) return RequestedFormat{"response_format", "json_object", [] { return any_json_grammar("object"); }};
  // `strict` false asks for best effort; holding the output to the schema is that too.
  std::string text = schema_text(*schema, "response_format.json_schema.schema");
  return RequestedFormat{"response_format.json_schema.schema", "json_schema\n" + text,
                         [text] { return json_schema_grammar(text); }};
}

std::optional<RequestedFormat> read_structured_outputs(const Json& body) {
  const Json* outputs = find_field(body, "structured_outputs");
  if (outputs == nullptr || outputs->is_null()) return std::nullopt;
  if (!outputs->is_object()) throw invalid_request("structured_outputs", "structured_outputs: expected an object");
  std::optional<RequestedFormat> format;
  auto set = [&](RequestedFormat f) {
    if (format) {
      throw invalid_request("structured_outputs", fmt::format("structured_outputs: {} and {} both given; set one of "
                                                              "json, regex, choice, grammar, json_object",
                                                              format->field, f.field));
    }
    format = std::move(f);
  };
  for (const auto& [key, value] : outputs->items()) {
    const std::string field = "structured_outputs." + key;
    if (value.is_null() || ignorable_structured_key(key)) continue;
    if (key == "json") {
      std::string text = schema_text(value, field);
      set({field, "json_schema\n" + text, [text] { return json_schema_grammar(text); }});
    } else if (key == "json_object") {
      if (value != true) continue;
      set({field, "json_object", [] { return any_json_grammar("object"); }});
    } else if (key == "regex" || key == "grammar") {
      if (!value.is_string()) throw invalid_request(field, fmt::format("{}: expected a string", field));
      std::string text = value.get<std::string>();
      if (key == "regex") set({field, "regex\n" + text, [text] { return regex_grammar(text); }});
      else set({field, "ebnf\n" + text, [text] { return ebnf_grammar(text); }});
    } else if (key == "choice") {
      if (!value.is_array() || value.empty())
        throw invalid_request(field, fmt::format("{}: expected a non-empty list of strings", field));
      std::vector<std::string> choices;
      for (const Json& choice : value) {
        if (!choice.is_string()) throw invalid_request(field, fmt::format("{}: expected a list of strings", field));
        choices.push_back(choice.get<std::string>());
      }
      set({field, "choice\n" + value.dump(), [choices] { return choice_grammar(choices); }});
    } else {
      // structural_tag, whitespace_pattern, disable_additional_properties, ...: not silently ignored.
      throw invalid_request(field, fmt::format("{} is not supported by this server (supported: json, regex, choice, "
                                               "grammar, json_object)",
                                               field));
    }
  }
  return format;
}

std::optional<RequestedFormat> read_requested_format(const Json& body) {
  std::optional<RequestedFormat> response_format = read_response_format(body);
  std::optional<RequestedFormat> structured = read_structured_outputs(body);
  if (response_format && structured) {
    throw invalid_request("structured_outputs", "response_format and structured_outputs both ask for a format; "
                                                "give one");
  }
  return response_format ? response_format : structured;
}

// Compiles through the cache; what the grammar engine refuses becomes a 400 naming the keyword and the field.
std::shared_ptr<const CompiledGrammar> compile(const ServingContext& context, const std::string& field,
                                               const std::string& key, GrammarVocabulary vocabulary,
                                               const std::function<Grammar()>& build, std::vector<TokenId> stop_tokens) {
  require(context.grammars != nullptr, "structured outputs: the server has no grammar cache");
  try {
    return context.grammars->get(key, vocabulary, build, std::move(stop_tokens));
  } catch (const UnsupportedGrammar& error) {
    throw invalid_request(field, fmt::format("{}: '{}' is not supported: {}", field, error.keyword(), error.what()));
  } catch (const ApiError&) {
    throw;
  } catch (const Error& error) {
    throw invalid_request(field, fmt::format("{}: {}", field, error.what()));
  }
}

// The request's function tools as Harmony recipients with their parameter schemas.
std::vector<HarmonyTool> request_tools(const Json& body, const std::string& tool_namespace) {
  std::vector<HarmonyTool> tools;
  const Json* list = find_field(body, "tools");
  if (list == nullptr || !list->is_array()) return tools;
  for (const Json& tool : *list) {
    const Json* function = find_field(tool, "function");
    if (function == nullptr || !function->is_object()) continue;  // openai_mapping reports malformed tools
    HarmonyTool harmony_tool;
    harmony_tool.recipient = tool_namespace + "." + optional_string(*function, "name").value_or("");
    if (const Json* parameters = find_field(*function, "parameters"); parameters != nullptr && !parameters->is_null())
      harmony_tool.parameters = parameters->dump();
    tools.push_back(std::move(harmony_tool));
  }
  return tools;
}

}  // namespace

std::shared_ptr<const CompiledGrammar> completion_grammar(const Json& body, const ServingContext& context) {
  std::optional<RequestedFormat> format = read_requested_format(body);
  if (!format) return nullptr;
  const std::vector<TokenId>& eos = context.generation_config.eos_token_ids;
  std::string key = format->key + "\neos";
  for (TokenId id : eos) key += fmt::format(" {}", id);
  return compile(context, format->field, key, GrammarVocabulary::kPlain, format->build, eos);
}

std::shared_ptr<const CompiledGrammar> chat_grammar(const Json& body, const ToolChoice& tool_choice,
                                                    const ServingContext& context) {
  std::optional<RequestedFormat> format = read_requested_format(body);
  const bool forced = tool_choice.mode == ToolChoiceMode::Required || tool_choice.mode == ToolChoiceMode::Named;
  if (!context.harmony_constraint && !format && !forced) return nullptr;

  const harmony::HarmonyTemplate& t = context.harmony_template;
  HarmonyConstraintSpec spec;
  spec.reasoning_channel = t.reasoning_channel;
  spec.final_channel = t.final_channel;
  spec.tool_channel = t.tool_channel;
  spec.tool_namespace = t.tool_namespace;
  if (tool_choice.mode != ToolChoiceMode::None) spec.tools = request_tools(body, t.tool_namespace);
  if (tool_choice.mode == ToolChoiceMode::Required) spec.start = HarmonyConstraintSpec::Start::kAfterRecipient;
  if (tool_choice.mode == ToolChoiceMode::Named) {
    const std::string recipient = t.tool_namespace + "." + tool_choice.name;
    std::erase_if(spec.tools, [&](const HarmonyTool& tool) { return tool.recipient != recipient; });
    spec.start = HarmonyConstraintSpec::Start::kAfterHeader;
  }
  std::string key = fmt::format("chat\n{}\n{}\n{}\n{}\n{}\n", t.reasoning_channel, t.final_channel, t.tool_channel,
                                t.tool_namespace, static_cast<int>(spec.start));
  for (const HarmonyTool& tool : spec.tools) key += tool.recipient + "\n" + tool.parameters.value_or("-") + "\n";
  key += format ? format->key : "text";
  // Each refusal names its field: the format's, or `tools` for a tool's parameters.
  auto refused = [](const std::string& field, const UnsupportedGrammar& error) {
    return invalid_request(field, fmt::format("{}: '{}' is not supported: {}", field, error.keyword(), error.what()));
  };
  return compile(
      context, format ? format->field : "tools", key, GrammarVocabulary::kHarmony,
      [&] {
        try {
          if (format) spec.final_content = format->build();
        } catch (const UnsupportedGrammar& error) {
          throw refused(format->field, error);
        }
        try {
          return harmony_grammar(spec);
        } catch (const UnsupportedGrammar& error) {
          throw refused("tools", error);
        }
      },
      {});
}

}  // namespace beamline::server

#include "harmony/harmony_tools.h"

#include <algorithm>
#include <string_view>

namespace beamline::harmony {

namespace {

// Every line of `text` as a `//` comment line; blank lines stay bare "//" (no trailing space).
void append_comment(std::string& out, const std::string& indent, std::string_view text) {
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find('\n', begin);
    const std::string_view line = text.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
    out += indent;
    out += line.empty() ? "//" : "// ";
    out += line;
    out += '\n';
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
}

// Trailing comments live on one line.
std::string single_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

const Json* member(const Json& schema, const char* key) {
  if (!schema.is_object()) return nullptr;
  auto it = schema.find(key);
  return it == schema.end() || it->is_null() ? nullptr : &*it;
}

const Json* union_variants(const Json& schema) {
  for (const char* key : {"oneOf", "anyOf"}) {
    const Json* variants = member(schema, key);
    if (variants != nullptr && variants->is_array() && !variants->empty()) return variants;
  }
  return nullptr;
}

bool is_nullable(const Json& schema) {
  const Json* nullable = member(schema, "nullable");
  return nullable != nullptr && nullable->is_boolean() && nullable->get<bool>();
}

bool has_properties(const Json& schema) {
  const Json* properties = member(schema, "properties");
  return properties != nullptr && properties->is_object() && !properties->empty();
}

std::string primitive_type(const std::string& name) {
  if (name == "integer" || name == "number") return "number";
  if (name == "string" || name == "boolean" || name == "null") return name;
  if (name == "array") return "any[]";
  if (name == "object") return "object";
  return "any";
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string joined;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) joined += separator;
    joined += parts[i];
  }
  return joined;
}

// A string default is written bare next to a literal union (its value is one of the quoted literals
// already on the line) and quoted otherwise.
std::string default_comment(const Json& value, const std::string& type_text) {
  if (value.is_string() && type_text.find('"') != std::string::npos) return "default: " + value.get<std::string>();
  return "default: " + value.dump();
}

std::string type_expression(const Json& schema, const std::string& indent);

void append_properties(std::string& out, const Json& schema, const std::string& indent) {
  std::vector<std::string> required;
  if (const Json* list = member(schema, "required"); list != nullptr && list->is_array()) {
    for (const Json& name : *list) {
      if (name.is_string()) required.push_back(name.get<std::string>());
    }
  }
  for (const auto& [key, property] : member(schema, "properties")->items()) {
    const bool optional = std::find(required.begin(), required.end(), key) == required.end();
    const std::string name = key + (optional ? "?" : "");
    if (const Json* title = member(property, "title"); title != nullptr && title->is_string()) {
      append_comment(out, indent, title->get<std::string>());
      out += indent + "//\n";
    }
    if (const Json* description = member(property, "description"); description != nullptr && description->is_string()) {
      append_comment(out, indent, description->get<std::string>());
    }
    if (const Json* examples = member(property, "examples");
        examples != nullptr && examples->is_array() && !examples->empty()) {
      out += indent + "// Examples:\n";
      for (const Json& example : *examples) {
        out += indent + "// - " + single_line(example.dump()) + "\n";
      }
    }
    const Json* default_value = member(property, "default");
    if (const Json* variants = union_variants(property)) {
      if (default_value != nullptr) out += indent + "// " + default_comment(*default_value, "") + "\n";
      out += indent + name + ":\n";
      for (const Json& variant : *variants) {
        const std::string type = type_expression(variant, indent + "   ");
        out += indent + " | " + type;
        std::vector<std::string> comments;
        if (const Json* description = member(variant, "description"); description != nullptr && description->is_string()) {
          comments.push_back(single_line(description->get<std::string>()));
        }
        if (const Json* variant_default = member(variant, "default")) {
          comments.push_back(default_comment(*variant_default, type));
        }
        if (!comments.empty()) out += " // " + join(comments, ", ");
        out += '\n';
      }
      if (is_nullable(property)) out += indent + " | null\n";
      out += indent + ",\n";
      continue;
    }
    const std::string type = type_expression(property, indent);
    out += indent + name + ": " + type + ",";
    if (default_value != nullptr) out += " // " + single_line(default_comment(*default_value, type));
    out += '\n';
  }
}

// A nested object: its description was already written as the property's comment.
std::string object_expression(const Json& schema, const std::string& indent) {
  if (!has_properties(schema)) {
    const Json* additional = member(schema, "additionalProperties");
    if (additional != nullptr && additional->is_object()) {
      return "Record<string, " + type_expression(*additional, indent) + ">";
    }
    return "object";
  }
  std::string out = "{\n";
  append_properties(out, schema, indent + "  ");
  out += indent + "}";
  return out;
}

std::string array_expression(const Json& schema, const std::string& indent) {
  const Json* items = member(schema, "items");
  if (items == nullptr || !items->is_object()) return "any[]";
  const std::string item_type = type_expression(*items, indent);
  const bool is_union = item_type.find(" | ") != std::string::npos && item_type.front() != '{';
  return is_union ? "(" + item_type + ")[]" : item_type + "[]";
}

std::string base_type_expression(const Json& schema, const std::string& indent) {
  if (!schema.is_object()) return "any";
  if (const Json* variants = union_variants(schema)) {
    std::vector<std::string> types;
    for (const Json& variant : *variants) types.push_back(type_expression(variant, indent));
    return join(types, " | ");
  }
  if (const Json* constant = member(schema, "const")) return constant->dump();
  if (const Json* values = member(schema, "enum"); values != nullptr && values->is_array() && !values->empty()) {
    std::vector<std::string> literals;
    for (const Json& value : *values) literals.push_back(value.dump());
    return join(literals, " | ");
  }
  const Json* type = member(schema, "type");
  if (type != nullptr && type->is_array()) {
    std::vector<std::string> types;
    for (const Json& name : *type) {
      if (name.is_string()) types.push_back(primitive_type(name.get<std::string>()));
    }
    if (!types.empty()) return join(types, " | ");
  }
  const std::string name = type != nullptr && type->is_string() ? type->get<std::string>() : "";
  if (name == "object" || (name.empty() && has_properties(schema))) return object_expression(schema, indent);
  if (name == "array" || (name.empty() && member(schema, "items") != nullptr)) return array_expression(schema, indent);
  return primitive_type(name);
}

std::string type_expression(const Json& schema, const std::string& indent) {
  std::string type = base_type_expression(schema, indent);
  const bool already_nullable = type == "null" || type.ends_with(" | null");
  if (is_nullable(schema) && !already_nullable) type += " | null";
  return type;
}

}  // namespace

std::string render_tool_signature(const std::optional<Json>& parameters) {
  if (!parameters || !parameters->is_object()) return "() => any";
  const Json& schema = *parameters;
  if (has_properties(schema)) {
    std::string out = "(_: ";
    if (const Json* description = member(schema, "description"); description != nullptr && description->is_string()) {
      append_comment(out, "", description->get<std::string>());
    }
    out += "{\n";
    append_properties(out, schema, "");
    out += "}) => any";
    return out;
  }
  const std::string type = type_expression(schema, "");
  if (type == "object") return "() => any";
  return "(_: " + type + ") => any";
}

std::string render_tool_namespace(const ToolNamespace& tool_namespace) {
  std::string out = "## " + tool_namespace.name + "\n\n";
  if (tool_namespace.tools.empty()) {
    out += tool_namespace.description.value_or("");
    return out;
  }
  if (tool_namespace.description) append_comment(out, "", *tool_namespace.description);
  out += "namespace " + tool_namespace.name + " {\n\n";
  for (const ToolDescription& tool : tool_namespace.tools) {
    if (!tool.description.empty()) append_comment(out, "", tool.description);
    out += "type " + tool.name + " = " + render_tool_signature(tool.parameters) + ";\n\n";
  }
  out += "} // namespace " + tool_namespace.name;
  return out;
}

std::string render_tools_section(const ToolNamespaces& namespaces) {
  std::vector<std::string> rendered;
  for (const auto& [key, tool_namespace] : namespaces) rendered.push_back(render_tool_namespace(tool_namespace));
  return "# Tools\n\n" + join(rendered, "\n\n");
}

}  // namespace beamline::harmony

#pragma once
// Reading fields out of untrusted JSON (conversation files, harmony.json, OpenAI requests) with errors that
// name the exact field, e.g. "messages[2].tool_calls[0].function.name: expected a string, got number".
// Templates so both nlohmann::json and nlohmann::ordered_json work.
#include <optional>
#include <string>
#include <vector>

#include "util/error.h"

namespace beamline::harmony::json_fields {

inline std::string path(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

inline std::string index_path(const std::string& where, std::size_t index) {
  return where + "[" + std::to_string(index) + "]";
}

template <typename JsonT>
void expect_object(const JsonT& json, const std::string& where) {
  require(json.is_object(), "{}: expected a JSON object, got {}", where, json.type_name());
}

template <typename JsonT>
void expect_array(const JsonT& json, const std::string& where) {
  require(json.is_array(), "{}: expected a JSON array, got {}", where, json.type_name());
}

// The member, or nullptr when it is absent or null.
template <typename JsonT>
const JsonT* find(const JsonT& object, const std::string& key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

template <typename JsonT>
std::optional<std::string> optional_string(const JsonT& object, const std::string& key, const std::string& where) {
  const JsonT* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  require(value->is_string(), "{}: expected a string, got {}", path(where, key), value->type_name());
  return value->template get<std::string>();
}

template <typename JsonT>
std::string required_string(const JsonT& object, const std::string& key, const std::string& where) {
  auto value = optional_string(object, key, where);
  require(value.has_value(), "{}: missing (a string is required)", path(where, key));
  return *value;
}

template <typename JsonT>
std::optional<bool> optional_bool(const JsonT& object, const std::string& key, const std::string& where) {
  const JsonT* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  require(value->is_boolean(), "{}: expected true or false, got {}", path(where, key), value->type_name());
  return value->template get<bool>();
}

template <typename JsonT>
std::vector<std::string> string_array(const JsonT& array, const std::string& where) {
  expect_array(array, where);
  std::vector<std::string> strings;
  for (std::size_t i = 0; i < array.size(); ++i) {
    require(array[i].is_string(), "{}: expected a string, got {}", index_path(where, i), array[i].type_name());
    strings.push_back(array[i].template get<std::string>());
  }
  return strings;
}

}  // namespace beamline::harmony::json_fields

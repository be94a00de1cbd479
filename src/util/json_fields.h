#pragma once
// The one reader of fields out of untrusted JSON (config.json, harmony.json, conversation files, OpenAI requests).
// Every failure names the document and the exact field, e.g.
//   config.json: key "quantization_config.quant_method": required key is missing
//   messages[2].tool_calls[0].function.name: must be a string, found number 5
// Templates so that both nlohmann::json and nlohmann::ordered_json work.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace beamline::json_fields {

// Where a value sits: the document it came from (a file such as "config.json"; empty for a request body, whose
// fields the client knows by path alone) and its path inside it ("messages[2].content").
struct Location {
  std::string source;
  std::string path;

  Location(std::string value_path = "") : path(std::move(value_path)) {}  // NOLINT: a bare path is a location
  Location(const char* value_path) : path(value_path) {}                  // NOLINT
  Location(std::string document, std::string value_path) : source(std::move(document)), path(std::move(value_path)) {}

  Location key(std::string_view name) const {
    return {source, path.empty() ? std::string(name) : fmt::format("{}.{}", path, name)};
  }
  Location index(std::size_t i) const { return {source, fmt::format("{}[{}]", path, i)}; }
  std::string describe() const {
    if (source.empty()) return path;
    return path.empty() ? source : fmt::format("{}: key \"{}\"", source, path);
  }
};

[[noreturn]] inline void fail_at(const Location& where, std::string_view reason) {
  fail("{}: {}", where.describe(), reason);
}

inline std::string path(const std::string& where, const std::string& key) { return Location(where).key(key).path; }
inline std::string index_path(const std::string& where, std::size_t index) { return Location(where).index(index).path; }

// "number 5", "string \"x\"": what a wrong value was, for the message.
template <typename JsonT>
std::string found(const JsonT& value) {
  return value.is_object() || value.is_array() ? std::string(value.type_name())
                                               : fmt::format("{} {}", value.type_name(), value.dump());
}

template <typename JsonT>
void expect_object(const JsonT& json, const Location& where) {
  if (!json.is_object()) fail_at(where, fmt::format("must be a JSON object, found {}", found(json)));
}

template <typename JsonT>
void expect_array(const JsonT& json, const Location& where) {
  if (!json.is_array()) fail_at(where, fmt::format("must be a JSON array, found {}", found(json)));
}

// The member, or nullptr when it is absent or null (clients send null for "not set").
template <typename JsonT>
const JsonT* find(const JsonT& object, std::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

template <typename JsonT>
const JsonT& required(const JsonT& object, std::string_view key, const Location& where) {
  const JsonT* value = find(object, key);
  if (value == nullptr) fail_at(where.key(key), "required key is missing");
  return *value;
}

// ---- one value, at `where` ----
template <typename JsonT>
std::string as_string(const JsonT& value, const Location& where) {
  if (!value.is_string()) fail_at(where, fmt::format("must be a string, found {}", found(value)));
  return value.template get<std::string>();
}

template <typename JsonT>
bool as_bool(const JsonT& value, const Location& where) {
  if (!value.is_boolean()) fail_at(where, fmt::format("must be true or false, found {}", found(value)));
  return value.template get<bool>();
}

// Finite numbers only.
template <typename JsonT>
double as_number(const JsonT& value, const Location& where) {
  if (!value.is_number()) fail_at(where, fmt::format("must be a number, found {}", found(value)));
  const double number = value.template get<double>();
  if (!std::isfinite(number)) fail_at(where, fmt::format("{} is not finite", value.dump()));
  return number;
}

// Whether 2.0 counts as the integer 2. Requests say yes (JSON clients often send whole numbers as floats); files
// written by tools (config.json) say no, so that a mistyped value is caught.
enum class IntegralFloats { Rejected, Accepted };

// Integers that fit 64 bits.
template <typename JsonT>
int64_t as_integer(const JsonT& value, const Location& where, IntegralFloats floats = IntegralFloats::Rejected) {
  if (value.is_number_unsigned() && value.template get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    fail_at(where, fmt::format("{} is out of range", value.dump()));
  if (value.is_number_integer()) return value.template get<int64_t>();
  if (value.is_number_float() && floats == IntegralFloats::Accepted) {
    const double number = value.template get<double>();
    // 2^63 is exactly representable; anything at or past it does not fit.
    if (std::isfinite(number) && std::floor(number) == number && std::fabs(number) < 9.2233720368547758e18)
      return static_cast<int64_t>(number);
  }
  fail_at(where, fmt::format("must be an integer, found {}", found(value)));
}

template <typename JsonT>
std::vector<std::string> string_array(const JsonT& array, const Location& where) {
  if (!array.is_array()) fail_at(where, fmt::format("must be a list of strings, found {}", found(array)));
  std::vector<std::string> strings;
  for (std::size_t i = 0; i < array.size(); ++i) strings.push_back(as_string(array[i], where.index(i)));
  return strings;
}

template <typename JsonT>
std::vector<int64_t> integer_array(const JsonT& array, const Location& where,
                                   IntegralFloats floats = IntegralFloats::Rejected) {
  if (!array.is_array()) fail_at(where, fmt::format("must be a list of integers, found {}", found(array)));
  std::vector<int64_t> integers;
  for (std::size_t i = 0; i < array.size(); ++i) integers.push_back(as_integer(array[i], where.index(i), floats));
  return integers;
}

// An integer or a list of them (config.json's eos_token_id).
template <typename JsonT>
std::vector<int64_t> integer_or_integers(const JsonT& value, const Location& where) {
  if (value.is_array()) return integer_array(value, where);
  if (!value.is_number())
    fail_at(where, fmt::format("must be an integer or a list of integers, found {}", found(value)));
  return {as_integer(value, where)};
}

// A string or a list of them (OpenAI's `stop`).
template <typename JsonT>
std::vector<std::string> string_or_strings(const JsonT& value, const Location& where) {
  if (value.is_string()) return {value.template get<std::string>()};
  if (!value.is_array()) fail_at(where, fmt::format("must be a string or a list of strings, found {}", found(value)));
  return string_array(value, where);
}

// ---- members of an object at `where`; absent or null members are nullopt ----
template <typename JsonT>
std::optional<std::string> optional_string(const JsonT& object, std::string_view key, const Location& where) {
  const JsonT* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  return as_string(*value, where.key(key));
}

template <typename JsonT>
std::string required_string(const JsonT& object, std::string_view key, const Location& where) {
  return as_string(required(object, key, where), where.key(key));
}

template <typename JsonT>
std::optional<bool> optional_bool(const JsonT& object, std::string_view key, const Location& where) {
  const JsonT* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  return as_bool(*value, where.key(key));
}

template <typename JsonT>
std::optional<double> optional_number(const JsonT& object, std::string_view key, const Location& where) {
  const JsonT* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  return as_number(*value, where.key(key));
}

template <typename JsonT>
double required_number(const JsonT& object, std::string_view key, const Location& where) {
  return as_number(required(object, key, where), where.key(key));
}

template <typename JsonT>
std::optional<int64_t> optional_integer(const JsonT& object, std::string_view key, const Location& where,
                                        IntegralFloats floats = IntegralFloats::Rejected) {
  const JsonT* value = find(object, key);
  if (value == nullptr) return std::nullopt;
  return as_integer(*value, where.key(key), floats);
}

template <typename JsonT>
int64_t required_integer(const JsonT& object, std::string_view key, const Location& where) {
  return as_integer(required(object, key, where), where.key(key));
}

// Absent or null: an empty list.
template <typename JsonT>
std::vector<std::string> optional_string_array(const JsonT& object, std::string_view key, const Location& where) {
  const JsonT* value = find(object, key);
  return value == nullptr ? std::vector<std::string>{} : string_array(*value, where.key(key));
}

}  // namespace beamline::json_fields

#include "server/request_fields.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace beamline::server {

namespace {

ApiError wrong_type(const std::string& key, const char* expected, const Json& value) {
  return invalid_request(key, fmt::format("{}: expected {}, got {}", key, expected, value.type_name()));
}

std::optional<int64_t> as_integer(const Json& value) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    const double number = value.get<double>();
    // 2^63 is exactly representable; anything at or past it does not fit.
    if (std::isfinite(number) && std::floor(number) == number && std::fabs(number) < 9.2233720368547758e18) {
      return static_cast<int64_t>(number);
    }
  }
  return std::nullopt;
}

}  // namespace

Json parse_body(const std::string& body) {
  Json json;
  try {
    json = Json::parse(body);
  } catch (const nlohmann::json::parse_error& error) {
    throw invalid_request("", std::string("The request body is not valid JSON: ") + error.what());
  }
  if (!json.is_object()) {
    throw invalid_request("", fmt::format("The request body must be a JSON object, got {}", json.type_name()));
  }
  return json;
}

const Json* find_field(const Json& object, const std::string& key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> optional_number(const Json& object, const std::string& key) {
  const Json* value = find_field(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) throw wrong_type(key, "a number", *value);
  return value->get<double>();
}

std::optional<int64_t> optional_integer(const Json& object, const std::string& key) {
  const Json* value = find_field(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_number()) throw wrong_type(key, "an integer", *value);
  auto integer = as_integer(*value);
  if (!integer) throw invalid_request(key, fmt::format("{}: expected an integer, got {}", key, value->dump()));
  return integer;
}

std::optional<bool> optional_bool(const Json& object, const std::string& key) {
  const Json* value = find_field(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_boolean()) throw wrong_type(key, "true or false", *value);
  return value->get<bool>();
}

std::optional<std::string> optional_string(const Json& object, const std::string& key) {
  const Json* value = find_field(object, key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) throw wrong_type(key, "a string", *value);
  return value->get<std::string>();
}

std::vector<std::string> string_or_strings(const Json& object, const std::string& key) {
  const Json* value = find_field(object, key);
  if (value == nullptr) return {};
  if (value->is_string()) return {value->get<std::string>()};
  if (!value->is_array()) throw wrong_type(key, "a string or a list of strings", *value);
  std::vector<std::string> strings;
  for (std::size_t i = 0; i < value->size(); ++i) {
    const Json& item = (*value)[i];
    if (!item.is_string()) {
      throw invalid_request(key, fmt::format("{}[{}]: expected a string, got {}", key, i, item.type_name()));
    }
    strings.push_back(item.get<std::string>());
  }
  return strings;
}

std::vector<int64_t> integer_list(const Json& object, const std::string& key) {
  const Json* value = find_field(object, key);
  if (value == nullptr) return {};
  if (!value->is_array()) throw wrong_type(key, "a list of integers", *value);
  std::vector<int64_t> integers;
  for (std::size_t i = 0; i < value->size(); ++i) {
    auto integer = as_integer((*value)[i]);
    if (!integer) {
      throw invalid_request(key, fmt::format("{}[{}]: expected an integer, got {}", key, i, (*value)[i].dump()));
    }
    integers.push_back(*integer);
  }
  return integers;
}

std::optional<int32_t> integer_in_range(const Json& object, const std::string& key, int64_t low, int64_t high) {
  auto value = optional_integer(object, key);
  if (!value) return std::nullopt;
  if (*value < low || *value > high) {
    throw invalid_request(key, fmt::format("{} must be between {} and {} (got {})", key, low, high, *value));
  }
  return static_cast<int32_t>(*value);
}

}  // namespace beamline::server

#include "server/request_fields.h"

#include <fmt/format.h>

#include "server/request_limits.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace beamline::server {

namespace {

namespace jf = beamline::json_fields;

// Runs one typed read of json_fields; its Error (which names the field) becomes a 400 whose param is `key`.
template <typename Read>
auto read_field(const std::string& key, Read read) {
  try {
    return read();
  } catch (const Error& error) {
    throw invalid_request(key, error.what());
  }
}

}  // namespace

Json parse_body(const std::string& body) {
  // Deeper nesting is refused while parsing: later steps (rendering tool schemas, writing JSON) recurse.
  const auto limit_depth = [](int depth, nlohmann::json::parse_event_t event, Json&) {
    if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) &&
        static_cast<std::size_t>(depth) >= kMaxJsonDepth) {
      throw invalid_request("", fmt::format("The request body nests objects and arrays deeper than {} levels",
                                            kMaxJsonDepth));
    }
    return true;
  };
  Json json;
  try {
    json = Json::parse(body, limit_depth);
  } catch (const nlohmann::json::exception& error) {
    // Not only parse_error: a number past a double's range (1E999) is nlohmann's out_of_range, which escaped
    // this message until tests/fuzz/fuzz_openai_chat_request found it.
    throw invalid_request("", std::string("The request body is not valid JSON: ") + error.what());
  }
  if (!json.is_object()) {
    throw invalid_request("", fmt::format("The request body must be a JSON object, got {}", json.type_name()));
  }
  return json;
}

const Json* find_field(const Json& object, const std::string& key) { return jf::find(object, key); }

std::optional<double> optional_number(const Json& object, const std::string& key) {
  return read_field(key, [&] { return jf::optional_number(object, key, {}); });
}

std::optional<int64_t> optional_integer(const Json& object, const std::string& key) {
  return read_field(key, [&] { return jf::optional_integer(object, key, {}, jf::IntegralFloats::Accepted); });
}

std::optional<bool> optional_bool(const Json& object, const std::string& key) {
  return read_field(key, [&] { return jf::optional_bool(object, key, {}); });
}

std::optional<std::string> optional_string(const Json& object, const std::string& key) {
  return read_field(key, [&] { return jf::optional_string(object, key, {}); });
}

std::vector<std::string> string_or_strings(const Json& object, const std::string& key) {
  const Json* value = jf::find(object, key);
  if (value == nullptr) return {};
  return read_field(key, [&] { return jf::string_or_strings(*value, key); });
}

std::vector<int64_t> integer_list(const Json& object, const std::string& key) {
  const Json* value = jf::find(object, key);
  if (value == nullptr) return {};
  return read_field(key, [&] { return jf::integer_array(*value, key, jf::IntegralFloats::Accepted); });
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

#pragma once
// Typed reads of top-level request fields. A wrong type is a 400 naming the field, e.g.
// {"param": "temperature", "message": "temperature: expected a number, got string"}.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"

namespace beamline::server {

// The body as a JSON object (400 for invalid JSON or another top-level type).
Json parse_body(const std::string& body);

// The member, or nullptr when it is absent or JSON null (OpenAI clients send null for "not set").
const Json* find_field(const Json& object, const std::string& key);

std::optional<double> optional_number(const Json& object, const std::string& key);
// Integers only; a float with an integral value (2.0) is accepted, 2.5 is not.
std::optional<int64_t> optional_integer(const Json& object, const std::string& key);
std::optional<bool> optional_bool(const Json& object, const std::string& key);
std::optional<std::string> optional_string(const Json& object, const std::string& key);
// A string or a list of strings (OpenAI's `stop`).
std::vector<std::string> string_or_strings(const Json& object, const std::string& key);
std::vector<int64_t> integer_list(const Json& object, const std::string& key);

// An integer field that must lie in [low, high]; 400 naming it otherwise.
std::optional<int32_t> integer_in_range(const Json& object, const std::string& key, int64_t low, int64_t high);

}  // namespace beamline::server

#include "server/api_error.h"

#include <nlohmann/json.hpp>

#include "engine/request.h"

namespace beamline::server {

Json ApiError::to_json() const {
  Json error = Json::object();
  error["message"] = what();
  error["type"] = type_;
  error["param"] = param_ ? Json(*param_) : Json(nullptr);
  error["code"] = code_ ? Json(*code_) : Json(nullptr);
  return Json{{"error", error}};
}

ApiError invalid_request(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_request_error", message, param.empty() ? std::nullopt : std::optional(param));
}

ApiError model_not_found(const std::string& model) {
  return ApiError(404, "invalid_request_error", "The model '" + model + "' does not exist.", "model",
                  "model_not_found");
}

ApiError unauthorized() {
  return ApiError(401, "invalid_request_error",
                  "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'.", std::nullopt,
                  "invalid_api_key");
}

ApiError not_found(const std::string& path) {
  return ApiError(404, "invalid_request_error", "Unknown route: " + path, std::nullopt, "not_found");
}

ApiError method_not_allowed(const std::string& method, const std::string& path) {
  return ApiError(405, "invalid_request_error", "Method " + method + " is not allowed for " + path, std::nullopt,
                  "method_not_allowed");
}

ApiError payload_too_large(std::size_t limit_bytes) {
  return ApiError(413, "invalid_request_error",
                  "Request body is larger than the server's limit of " + std::to_string(limit_bytes) +
                      " bytes (--max-request-body-bytes).",
                  std::nullopt, "request_too_large");
}

ApiError server_shutting_down() {
  return ApiError(503, "service_unavailable", "The server is shutting down and accepts no new requests.");
}

ApiError internal_error(const std::string& message) {
  return ApiError(500, "internal_server_error", message);
}

std::optional<std::string> field_of_message(const std::string& message) {
  const std::size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  const std::string field = message.substr(0, colon);
  for (char c : field) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!word && c != '.' && c != '[' && c != ']') return std::nullopt;
  }
  return field;
}

ApiError to_api_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const ApiError& api_error) {
    return api_error;
  } catch (const InvalidRequest& invalid) {
    return invalid_request(invalid.param(), invalid.what());
  } catch (const nlohmann::json::exception& json_error) {
    return invalid_request("", std::string("Invalid JSON: ") + json_error.what());
  } catch (const Error& bad_input) {
    return invalid_request(field_of_message(bad_input.what()).value_or(""), bad_input.what());
  } catch (const std::exception& unexpected) {
    return internal_error(unexpected.what());
  } catch (...) {
    return internal_error("unknown error");
  }
}

}  // namespace beamline::server

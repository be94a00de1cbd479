#pragma once
// OpenAI-style API errors: every failed request is answered with an HTTP status and the body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// so clients written against the OpenAI API (and vLLM) report them as they would there.
#include <exception>
#include <optional>
#include <string>

#include "harmony/harmony_message.h"
#include "util/error.h"

namespace beamline::server {

using Json = harmony::Json;

class ApiError : public Error {
 public:
  ApiError(int status, std::string type, std::string message, std::optional<std::string> param = std::nullopt,
           std::optional<std::string> code = std::nullopt)
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::optional<std::string>& param() const { return param_; }
  const std::optional<std::string>& code() const { return code_; }

  Json to_json() const;

 private:
  int status_;
  std::string type_;
  std::optional<std::string> param_;
  std::optional<std::string> code_;
};

// 400 invalid_request_error naming the field.
ApiError invalid_request(const std::string& param, const std::string& message);
// 404 for a model name this server does not serve (OpenAI's model_not_found).
ApiError model_not_found(const std::string& model);
ApiError unauthorized();                    // 401
ApiError not_found(const std::string& path);  // 404 for an unknown route
ApiError method_not_allowed(const std::string& method, const std::string& path);  // 405
ApiError payload_too_large(std::size_t limit_bytes);  // 413
ApiError server_shutting_down();            // 503
ApiError internal_error(const std::string& message);  // 500

// The field a message of the form "messages[2].tool_call_id: expected ..." names (what harmony's JSON
// readers and the engine's validation write), or nullopt when it does not start with one.
std::optional<std::string> field_of_message(const std::string& message);

// Maps whatever a request handler threw to the error the client gets: ApiError as it is, the engine's
// InvalidRequest and beamline::Error (bad input found by the text layer) as 400 naming the field,
// JSON parse errors as 400, anything else as 500.
ApiError to_api_error(std::exception_ptr error);

}  // namespace beamline::server

#include "server/sse.h"

namespace beamline::server {

std::string dump_json(const Json& json) { return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string sse_event(const Json& json) { return "data: " + dump_json(json) + "\n\n"; }

std::string sse_error(const ApiError& error) { return sse_event(error.to_json()) + kSseDone; }

}  // namespace beamline::server

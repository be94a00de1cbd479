#include "server/serving_context.h"

#include <fmt/format.h>

#include <chrono>
#include <random>

namespace beamline::server {

std::string new_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return fmt::format("{}-{:016x}{:016x}", prefix, generator(), generator());
}

int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace beamline::server

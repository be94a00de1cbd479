#include "server/routed_experts_json.h"

#include "util/base64.h"

namespace beamline::server {

std::string routed_experts_base64(std::span<const int16_t> ids) {
  std::string bytes;
  bytes.reserve(ids.size() * 2);
  for (const int16_t id : ids) {
    const auto value = static_cast<uint16_t>(id);
    bytes += static_cast<char>(value & 0xFF);
    bytes += static_cast<char>(value >> 8);
  }
  return encode_base64(bytes);
}

}  // namespace beamline::server

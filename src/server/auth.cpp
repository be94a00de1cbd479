#include "server/auth.h"

namespace beamline::server {

bool bearer_token_matches(std::string_view authorization_header, std::string_view api_key) {
  constexpr std::string_view scheme = "Bearer ";
  if (!authorization_header.starts_with(scheme)) return false;
  const std::string_view token = authorization_header.substr(scheme.size());
  unsigned difference = token.size() == api_key.size() ? 0u : 1u;
  for (std::size_t i = 0; i < api_key.size(); ++i) {
    const char offered = i < token.size() ? token[i] : '\0';
    difference |= static_cast<unsigned char>(offered ^ api_key[i]);
  }
  return difference == 0;
}

bool path_needs_api_key(std::string_view path) { return path == "/v1" || path.starts_with("/v1/"); }

}  // namespace beamline::server

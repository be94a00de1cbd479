#pragma once
// Standard base64 (RFC 4648, '=' padding): tiktoken rank files decode it, the RL API's routed experts are sent in it
// (SGLang's encoding of binary arrays in JSON).
#include <optional>
#include <string>
#include <string_view>

namespace beamline {

std::string encode_base64(std::string_view bytes);
// nullopt when `text` is empty or not valid padded base64.
std::optional<std::string> decode_base64(std::string_view text);

}  // namespace beamline

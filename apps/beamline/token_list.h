#pragma once
// Shared parsing of the `--tokens 5,17,300` option of the model commands.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "tensor/dtype.h"

namespace beamline::cli {

// Comma-separated token ids, each in [0, vocab_size); an Error names the option, the entry and its index.
std::vector<int32_t> parse_token_list(std::string_view text, int64_t vocab_size, std::string_view option);

}  // namespace beamline::cli

#pragma once
// One error type for the whole project. Messages say what went wrong and where
// (file, tensor, key, byte offset, request field), so a user can act on them.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace beamline {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Checks a condition that depends on input data (never on programmer error); fails with the message.
template <typename... Args>
void require(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace beamline

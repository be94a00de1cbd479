#pragma once
// Backends by device name ("cpu", "cuda", or "auto": CUDA where a device is present, else the CPU), kept apart from the op set (backend.h) so that the interface includes
// no implementation. The CPU backend is always there; others register a factory (the CUDA library does so from a
// static initialiser when it is linked in). An unknown or unavailable device is an Error that says how to get it.
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "backend/backend.h"

namespace beamline {

using BackendFactory = std::function<std::unique_ptr<Backend>()>;
void register_backend(std::string name, BackendFactory factory);
std::unique_ptr<Backend> create_backend(std::string_view device);

}  // namespace beamline

#pragma once
// vLLM's set_ulimit: every client connection is an open file, and the soft limit a shell hands down is often 1,024,
// which thousands of concurrent clients would exceed (accept() then fails with EMFILE).
#include <cstdint>

namespace beamline {

// Raises the soft RLIMIT_NOFILE towards `wanted` (never past the hard limit, never lowering it) and logs the change;
// warns, naming the limit, when the hard limit keeps it below `wanted`. Returns the soft limit in force.
uint64_t raise_open_file_limit(uint64_t wanted);

// vLLM's target: 65,535 descriptors.
inline constexpr uint64_t kWantedOpenFiles = 65535;

}  // namespace beamline

#include "util/open_file_limit.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace beamline {

uint64_t raise_open_file_limit(uint64_t wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("cannot read the open-file limit: {}", std::strerror(errno));
    return 0;
  }
  if (limit.rlim_cur >= wanted) return limit.rlim_cur;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = std::min<rlim_t>(wanted, limit.rlim_max);
  if (limit.rlim_cur > before && ::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("cannot raise the open-file limit from {}: {}", before, std::strerror(errno));
    return before;
  }
  if (limit.rlim_cur < wanted) {
    spdlog::warn("open-file limit {} (the hard limit): at most about that many client connections at once; "
                 "raise it with `ulimit -Hn` or systemd's LimitNOFILE", limit.rlim_cur);
  } else {
    spdlog::info("open-file limit raised from {} to {}", before, limit.rlim_cur);
  }
  return limit.rlim_cur;
}

}  // namespace beamline

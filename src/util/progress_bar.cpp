#include "util/progress_bar.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

namespace beamline {

namespace {
constexpr std::size_t kBarWidth = 40;
}  // namespace

ProgressBar::ProgressBar(std::string label, std::size_t total)
    : label_(std::move(label)), total_(std::max<std::size_t>(total, 1)), terminal_(isatty(STDERR_FILENO) == 1) {}

void ProgressBar::update(std::size_t done) {
  std::lock_guard lock(mutex_);
  done = std::min(done, total_);
  if (terminal_) {
    const std::size_t filled = done * kBarWidth / total_;
    const std::string line = fmt::format("\r{}: {:3}% |{}{}| {}/{}", label_, done * 100 / total_, std::string(filled, '#'),
                                         std::string(kBarWidth - filled, ' '), done, total_);
    std::fputs(line.c_str(), stderr);
    if (done == total_) std::fputc('\n', stderr);
    std::fflush(stderr);
    return;
  }
  const std::size_t tenth = done * 10 / total_;
  if (tenth > last_tenth_) {
    last_tenth_ = tenth;
    spdlog::info("{}: {}/{} ({}%)", label_, done, total_, done * 100 / total_);
  }
}

}  // namespace beamline

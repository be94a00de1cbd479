#pragma once
// Progress of long work, as vLLM shows it for checkpoint shards: a bar redrawn in place on a terminal, a plain log
// line at each tenth otherwise (logs and CI output stay readable). Safe to update from several threads.
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>

namespace beamline {

class ProgressBar {
 public:
  // Draws to stderr; `label` names the work ("Benchmark", "Loading tensors").
  ProgressBar(std::string label, std::size_t total);
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `done` of `total` finished; the last call (done == total) ends the bar's line.
  void update(std::size_t done);

 private:
  std::string label_;
  std::size_t total_;
  bool terminal_;
  std::size_t last_tenth_ = 0;
  std::mutex mutex_;
};

}  // namespace beamline

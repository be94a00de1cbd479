#pragma once
// Server-sent events read incrementally: bytes arrive in whatever pieces the socket gives, events come out
// whole. Only what the OpenAI streaming APIs use: `event:` and `data:` fields, comment lines, blank-line ends.
#include <string>
#include <string_view>
#include <vector>

namespace beamline::loadgen {

struct SseEvent {
  std::string event;  // the `event:` field ("" when absent: Chat/Completions chunks have none)
  std::string data;   // the `data:` lines joined with "\n"
};

class SseReader {
 public:
  // The events that `bytes` completes (none while an event is still open).
  std::vector<SseEvent> push(std::string_view bytes);

 private:
  void take_line(std::string_view line, std::vector<SseEvent>& events);

  std::string pending_;  // bytes of an unfinished line
  SseEvent current_;
  bool has_data_ = false;
};

}  // namespace beamline::loadgen

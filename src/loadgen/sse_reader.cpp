#include "loadgen/sse_reader.h"

namespace beamline::loadgen {

std::vector<SseEvent> SseReader::push(std::string_view bytes) {
  std::vector<SseEvent> events;
  pending_.append(bytes);
  std::size_t start = 0;
  for (std::size_t end; (end = pending_.find('\n', start)) != std::string::npos; start = end + 1) {
    std::string_view line(pending_.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    take_line(line, events);
  }
  pending_.erase(0, start);
  return events;
}

void SseReader::take_line(std::string_view line, std::vector<SseEvent>& events) {
  if (line.empty()) {
    // A blank line ends the event; one without data (only comments, e.g. keep-alives) is no event.
    if (has_data_) events.push_back(std::move(current_));
    current_ = {};
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;
  const std::size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    if (has_data_) current_.data += '\n';
    current_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    current_.event = std::string(value);
  }
}

}  // namespace beamline::loadgen

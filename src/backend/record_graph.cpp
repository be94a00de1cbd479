#include "backend/record_graph.h"

#include "util/error.h"

namespace beamline {

std::unique_ptr<OpGraph> record_graph(Backend& backend, const std::function<void()>& ops) {
  backend.begin_capture();
  try {
    ops();
  } catch (...) {
    try {
      backend.end_capture();
    } catch (const Error&) {
    }
    throw;
  }
  return backend.end_capture();
}

}  // namespace beamline

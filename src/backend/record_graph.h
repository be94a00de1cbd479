#pragma once
// Recording a graph of ops (Backend::begin_capture .. end_capture) around a callable, for the recorded decode steps
// (runner/decode_graphs) and drafter passes (spec/block_drafter).
#include <functional>
#include <memory>

#include "backend/backend.h"

namespace beamline {

// What `ops` enqueues on `backend`, recorded (nothing runs). When an op throws, the capture is ended and the op's own
// error is the one that propagates, not the aborted capture's.
std::unique_ptr<OpGraph> record_graph(Backend& backend, const std::function<void()>& ops);

}  // namespace beamline

#pragma once
// What rank 0 broadcasts to the other ranks of a distributed model before each step (docs/parallel.md): the step's
// ForwardBatch, whose deferred tokens it has already filled in, or the order to stop. Plain int32 words.
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "model/forward_batch.h"

namespace beamline {

// `batch` null: stop.
std::vector<std::byte> encode_step_message(const ForwardBatch* batch);
// The batch, or nullopt for stop; an Error when the bytes are not a message encode_step_message wrote.
std::optional<ForwardBatch> decode_step_message(std::span<const std::byte> bytes);

}  // namespace beamline

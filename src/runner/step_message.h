#pragma once
// What rank 0 broadcasts to the other ranks of a distributed model before each step (docs/parallel.md): the step's
// plan, a ForwardBatch per data-parallel replica whose deferred tokens it has already filled in, or the order to stop.
// Plain int32 words.
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "model/forward_batch.h"

namespace beamline {

// One entry per data-parallel replica (one without data parallelism): its batch, or none when it has no work (then, with
// expert parallelism, it runs a dummy step to join the others' expert collectives).
using ReplicaBatches = std::vector<std::optional<ForwardBatch>>;

// `plan` null: stop.
std::vector<std::byte> encode_step_message(const ReplicaBatches* plan);
// The plan, or nullopt for stop; an Error when the bytes are not a message encode_step_message wrote.
std::optional<ReplicaBatches> decode_step_message(std::span<const std::byte> bytes);

}  // namespace beamline

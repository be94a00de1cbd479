#pragma once
// What rank 0 broadcasts to the other ranks of a distributed model before each step (docs/parallel.md): the step's
// plan, a ForwardBatch per data-parallel replica whose deferred tokens it has already filled in; new weights to take
// between two steps (docs/rl.md); or the order to stop. Plain int32 words.
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/forward_batch.h"
#include "tensor/tensor_view.h"

namespace beamline {

// One entry per data-parallel replica (one without data parallelism): its batch, or none when it has no work (then, with
// expert parallelism, it runs a dummy step to join the others' expert collectives).
using ReplicaBatches = std::vector<std::optional<ForwardBatch>>;

// New weights for every rank (BeamModelRunner's weight updates): the safetensors directory each rank reads, or, when
// `directory` is empty, the tensors rank 0 received, whose bytes follow the message, one broadcast per tensor in this
// order (these views carry name, dtype and shape; no data).
struct WeightUpdateOrder {
  std::string directory;
  std::vector<TensorView> tensors;
};

struct StepMessage {
  enum class Kind { Step, Stop, Weights } kind = Kind::Stop;
  ReplicaBatches plan;        // Step
  WeightUpdateOrder weights;  // Weights
};

// `plan` null: stop.
std::vector<std::byte> encode_step_message(const ReplicaBatches* plan);
std::vector<std::byte> encode_weight_update_message(const WeightUpdateOrder& order);
// An Error when the bytes are not a message the encoders wrote.
StepMessage decode_step_message(std::span<const std::byte> bytes);

}  // namespace beamline

#pragma once
// How a random-weights model draws each tensor (make-model's checkpoints and --load-format dummy alike): norms
// near 1, projections and the router with fan-in scaling, the router in F32 as the format requires.
#include "model/checkpoint_layout.h"
#include "model/weights.h"

namespace beamline {

// `dtype` is the float storage type asked for (F32, BF16, F16); the router tensors are F32 whatever it is.
RandomInit random_init(const ExpectedTensor& tensor, DType dtype);

}  // namespace beamline

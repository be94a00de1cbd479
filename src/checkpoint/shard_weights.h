#pragma once
// One rank's part of a model's weights (model/model_shard.h), sliced at load time: row slices point into the mmap'd
// safetensors (no copy), column slices (o_proj, down_proj) are copied, and the slices of a dummy model
// (--load-format dummy) are drawn on the host with the same counter-based values the whole tensor would have had.
// Tensors the shard needs whole (norms, router, embeddings, experts under expert parallelism) and those it does not
// compute (other stages' layers, other ranks' experts) are left as they are: BeamModel only loads what it uses.
#include "model/model_shard.h"
#include "model/weights.h"

namespace beamline {

// Quantized projections are sliced in their own layouts (quant/slice.h: rows as views, columns copied, scales cut with
// their codes); a cut that the layout cannot hold is refused on every rank alike, naming the tensor, its shape, the
// scheme's block or group and the flag.
BeamWeights shard_weights(const BeamWeights& weights, const ModelShard& shard);

}  // namespace beamline

#pragma once
// BeamWeights from a checkpoint directory, or drawn at random with no checkpoint. Both check every expected tensor
// against the config (docs/model-format.md §3, §5) before any compute.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>

#include "model/config.h"
#include "model/weights.h"
#include "tensor/dtype.h"

namespace beamline {

// Loads config.json and the safetensors (single or sharded) of `dir`; every expected tensor must exist with the
// expected shape and a supported dtype, or this throws naming the file and tensor.
BeamWeights load_checkpoint(const std::filesystem::path& dir);

// New weights for a model being served (/update_weights_from_disk): the safetensors of `dir` checked as
// load_checkpoint checks them against the served config (a config.json there must describe the same model), and
// stricter: a tensor the model does not have is an error naming it, not a warning. The router must be F32. A server
// quantized at load takes a float checkpoint too, quantized as at load (quantize_weights).
BeamWeights load_weight_update(const std::filesystem::path& dir, const ModelConfig& served);
// The served weights with some tensors replaced by `received` (/update_weights_from_distributed, docs/rl.md), checked
// as load_weight_update checks a directory's: each a tensor of the model (by checkpoint name, at most once), with its
// shape and BF16/F16/F32 (a BF16/F16 router is widened to F32). A projection served quantized is quantized on arrival
// (with_quantized_projections: what --quantization would have made of it). The result keeps `received`'s bytes alive
// where it uses them; `served` is not changed.
// `apply`, when given, picks the tensors to put in (a rank of a distributed model: those its shard computes with);
// the others are checked all the same.
BeamWeights with_received_tensors(const BeamWeights& served, std::span<const HostTensor> received,
                                  const std::function<bool(std::string_view)>& apply = {});
// No checkpoint (vLLM's --load-format dummy): every view has its name, dtype and shape but no data, and the backend
// draws it (Backend::random_weight), on the device for a GPU, exactly as make-model would have written it with this
// seed and dtype.
BeamWeights dummy_weights(const ModelConfig& config, uint64_t seed, DType dtype = DType::BF16);

}  // namespace beamline

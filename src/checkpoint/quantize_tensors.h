#pragma once
// Quantizing a float model's projections into the layouts of docs/model-format.md §5, tensor by tensor in bounded
// memory. One path for every producer: `beamline quantize` (a checkpoint on disk), `make-model --quantization`
// (random weights), and `--quantization` at load (vLLM's online quantization of a float checkpoint, or
// --load-format dummy): each turns float TensorSources into quantized ones with quantized_sources.
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint_writer.h"
#include "model/config.h"
#include "model/model_shard.h"
#include "model/weights.h"
#include "quant/quant_scheme.h"

namespace beamline {

// The quantization_config of `scheme` (what vLLM reads: quant_method, quant_algo, weight_block_size), leaving the
// projections under the tensor-name prefixes `modules_to_not_convert` in their float dtype.
QuantizationConfig quantization_config_for(QuantScheme scheme, std::vector<std::string> modules_to_not_convert);
// The scheme a parsed quantization_config names (ModelConfig has accepted only these three).
QuantScheme quant_scheme_of(const QuantizationConfig& quant);
// `--quantization NAME` as a scheme: fp8, mxfp8 or nvfp4, else an Error naming the flag and the accepted names.
QuantScheme parse_quantization_flag(std::string_view name);

// `tensors`, float tensors named as expected_tensors(config) names them (others pass through), with every projection
// that `quant` converts (all but those under its ignored prefixes; router, norms and embeddings are not projections)
// replaced by its quantized tensors: X.weight (codes), X.weight_scale_inv (fp8) or X.weight_scale, and
// X.weight_scale_2 (nvfp4). Their bytes are computed from the float tensor's bytes, a band of rows at a time (at most
// 16 MiB of F32), whenever the writer asks for them, so a checkpoint of any size quantizes in bounded memory. nvfp4
// first reads the whole float tensor once for its amax (weight_scale_2).
std::vector<TensorSource> quantized_sources(const ModelConfig& config, std::vector<TensorSource> tensors,
                                            const QuantizationConfig& quant);

// Float weights (a loaded unquantized checkpoint, or dummy_weights) with the projections that `quant` converts
// quantized into memory the result owns (slice_buffers), and config.quantization set: what --quantization does to a
// checkpoint that has no quantization_config. Dummy weights are drawn on the host first (make-model --quantization's
// bytes). With `shard` (a rank of a distributed run) only the projections it computes are quantized (its stage's
// layers, its experts, the LM head on the last stage; the others stay float and are never loaded), each whole, with
// the bytes one process would have: shard_weights then slices them (docs/parallel.md, Quantized weights).
BeamWeights quantize_weights(BeamWeights weights, const QuantizationConfig& quant,
                             const std::optional<ModelShard>& shard = std::nullopt);
// Weight sync into a quantized server (docs/rl.md): `weights` (served quantized) with the projections named by
// `float_projections` (float [out, in] tensors a trainer sent, each a projection served quantized) replaced by their
// quantization under weights.config.quantization, computed by the same code as quantize_weights and `beamline
// quantize`, so bit for bit what a server started from those float weights with --quantization would hold. The
// quantized bytes are the result's (slice_buffers); `float_projections` need not outlive the call.
BeamWeights with_quantized_projections(BeamWeights weights, std::span<const TensorView> float_projections);

}  // namespace beamline

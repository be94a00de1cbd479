#pragma once
// The tensors of a Beam checkpoint, found by name and checked against the config (docs/model-format.md §3)
// before any compute. Views point into the mmap'd safetensors files, which this object keeps open.
#include <filesystem>
#include <map>
#include <string>
#include <memory>
#include <optional>
#include <vector>

#include "model/config.h"
#include "tensor/dtype.h"
#include "tensor/tensor_view.h"

namespace beamline {

class SafetensorsArchive;  // checkpoint/safetensors.h

// How a random-weights tensor is drawn (checkpoint/random_init.h): normal(mean, stddev), stored as `dtype`.
struct RandomInit {
  DType dtype = DType::BF16;  // as stored
  float mean = 0.0f, stddev = 1.0f;
};

// A projection weight [out, in] as stored. Unquantized: only `weight`. Quantized (docs/model-format.md §5):
// `weight` holds the codes, `scale` the block/group scales (weight_scale_inv or weight_scale), and `scale_2`
// the NVFP4 per-tensor scale; empty views (data == nullptr) where a scheme has none.
struct LinearWeight {
  TensorView weight, scale, scale_2;
  int64_t out_features() const { return weight.shape.at(0); }
  bool quantized() const { return scale.data != nullptr; }
};

struct ExpertWeights {
  LinearWeight gate_proj, up_proj, down_proj;  // [I,H], [I,H], [H,I]
};

struct LayerWeights {
  TensorView input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
  LinearWeight q_proj, k_proj, v_proj, o_proj;
  // dense layers
  std::optional<ExpertWeights> mlp;           // gate/up [F,H], down [H,F]
  // MoE layers
  TensorView router;                          // mlp.gate.weight [E,H] F32
  TensorView router_bias;                     // mlp.gate.e_score_correction_bias [E] F32
  std::vector<ExpertWeights> experts;         // [E]
  // vLLM's per-tensor FP8 KV cache scales (self_attn.k_scale, self_attn.v_scale: F32 scalars, finite and > 0), where
  // the checkpoint has them (docs/quantization.md#fp8-kv-cache).
  std::optional<float> k_scale, v_scale;
};

struct BeamWeights {
  ModelConfig config;
  TensorView embed_tokens;                    // [V,H]
  std::vector<LayerWeights> layers;
  TensorView norm;                            // [H]
  LinearWeight lm_head;                       // [V,H] (embed_tokens when tie_word_embeddings)
  std::shared_ptr<const SafetensorsArchive> archive;  // keeps the mappings alive
  // Host bytes the views point into besides the archive: slices checkpoint/shard_weights.h had to copy (columns, or a
  // dummy tensor's slice drawn on the host), projections quantized at load or on arrival (checkpoint/quantize_tensors.h),
  // tensors received from a trainer.
  std::vector<std::shared_ptr<const std::vector<std::byte>>> slice_buffers;

  // Every tensor the model is made of (quantization scales included), each once, for sizing.
  std::vector<const TensorView*> views() const;

  // Set by dummy_weights (checkpoint/checkpoint_loader.h): the draw of every tensor, for the backend to make.
  std::optional<uint64_t> random_seed;
  std::map<std::string, RandomInit, std::less<>> random_inits;  // by tensor name
};

}  // namespace beamline

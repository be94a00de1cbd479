#pragma once
// Which part of the model one rank computes (docs/parallel.md), from the config and the rank's place in the parallel
// layout, with vLLM's rules: attention by heads (KV heads replicated once the tensor-parallel ranks outnumber them),
// the dense MLP and, without expert parallelism, each expert's intermediate split across the tensor-parallel group,
// whole experts spread over the data x tensor ranks with --enable-expert-parallel, the LM head by vocabulary rows,
// and the layers by pipeline stage. Sizes that do not divide are refused naming the config key.
#include <cstdint>

#include "model/config.h"
#include "parallel/parallel_config.h"

namespace beamline {

struct ModelShard {
  int64_t q_heads = 0, q_head_begin = 0;    // this rank's query heads
  int64_t kv_heads = 0, kv_head_begin = 0;  // and the KV heads they read
  int64_t layer_begin = 0, layer_end = 0;   // this stage's layers
  int64_t ffn_size = 0, ffn_begin = 0;      // dense layers: the intermediate slice
  int64_t moe_size = 0, moe_begin = 0;      // each expert's intermediate slice (whole with expert parallelism)
  int64_t expert_begin = 0, expert_end = 0; // the experts this rank computes
  int64_t vocab_size = 0, vocab_begin = 0;  // the LM head's rows

  // The whole model on one rank.
  static ModelShard whole(const ModelConfig& config);
  bool whole_model(const ModelConfig& config) const;
  bool owns_layer(int64_t layer) const { return layer >= layer_begin && layer < layer_end; }
};

// The shard of the rank at `at` of `parallel`; an Error naming the key and flag when a size does not divide.
ModelShard model_shard(const ModelConfig& config, const ParallelConfig& parallel, RankCoordinates at);

}  // namespace beamline

#include "model/model_shard.h"

#include "util/error.h"

namespace beamline {
namespace {

// The `part`-th of `parts` equal slices of `total`, whose key names the size in messages.
void split(int64_t total, int32_t parts, int32_t part, const char* key, const char* flag, int64_t& size, int64_t& begin) {
  require(total % parts == 0, "config {} = {} does not divide by {} {}", key, total, flag, parts);
  size = total / parts;
  begin = size * part;
}

}  // namespace

ModelShard ModelShard::whole(const ModelConfig& config) {
  ModelShard shard;
  shard.q_heads = config.num_attention_heads;
  shard.kv_heads = config.num_key_value_heads;
  shard.layer_end = config.num_hidden_layers;
  shard.ffn_size = config.intermediate_size;
  shard.moe_size = config.moe_intermediate_size;
  shard.expert_end = config.n_routed_experts;
  shard.vocab_size = config.vocab_size;
  return shard;
}

bool ModelShard::whole_model(const ModelConfig& config) const {
  const ModelShard all = whole(config);
  return q_heads == all.q_heads && kv_heads == all.kv_heads && layer_begin == 0 && layer_end == all.layer_end &&
         ffn_size == all.ffn_size && moe_size == all.moe_size && expert_begin == 0 && expert_end == all.expert_end &&
         vocab_size == all.vocab_size;
}

ModelShard model_shard(const ModelConfig& config, const ParallelConfig& parallel, RankCoordinates at) {
  parallel.validate();
  ModelShard shard = ModelShard::whole(config);
  const int32_t tp = parallel.tensor, rank = at.tensor;
  const char* tp_flag = "--tensor-parallel-size";
  split(config.num_attention_heads, tp, rank, "num_attention_heads", tp_flag, shard.q_heads, shard.q_head_begin);
  if (tp <= config.num_key_value_heads) {
    split(config.num_key_value_heads, tp, rank, "num_key_value_heads", tp_flag, shard.kv_heads, shard.kv_head_begin);
  } else {
    // More ranks than KV heads: each rank keeps the one KV head its query heads read (vLLM replicates them).
    require(tp % config.num_key_value_heads == 0,
            "--tensor-parallel-size {} above num_key_value_heads {} must be a multiple of it (KV heads are replicated)",
            tp, config.num_key_value_heads);
    shard.kv_heads = 1;
    shard.kv_head_begin = rank / (tp / config.num_key_value_heads);
  }
  int64_t layers = 0;
  split(config.num_hidden_layers, parallel.pipeline, at.pipeline, "num_hidden_layers", "--pipeline-parallel-size",
        layers, shard.layer_begin);
  shard.layer_end = shard.layer_begin + layers;
  if (config.first_k_dense_replace > 0)
    split(config.intermediate_size, tp, rank, "intermediate_size", tp_flag, shard.ffn_size, shard.ffn_begin);
  if (config.n_routed_experts > 0) {
    if (parallel.expert) {
      int64_t count = 0;
      const int32_t ep = parallel.data * tp;
      require(config.n_routed_experts % ep == 0,
              "config n_routed_experts = {} does not divide by the {} expert-parallel ranks (--data-parallel-size {} x "
              "--tensor-parallel-size {})",
              config.n_routed_experts, ep, parallel.data, tp);
      split(config.n_routed_experts, ep, at.data * tp + rank, "n_routed_experts", "expert-parallel ranks", count,
            shard.expert_begin);
      shard.expert_end = shard.expert_begin + count;
    } else {
      split(config.moe_intermediate_size, tp, rank, "moe_intermediate_size", tp_flag, shard.moe_size, shard.moe_begin);
    }
  }
  split(config.vocab_size, tp, rank, "vocab_size", tp_flag, shard.vocab_size, shard.vocab_begin);
  return shard;
}

}  // namespace beamline

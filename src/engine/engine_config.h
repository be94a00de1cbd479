#pragma once
// Engine options, shared by every command that runs the engine (serve, bench). Flag names follow vLLM's.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/logprobs_mode.h"
#include "spec/speculative_config.h"

namespace CLI {
class App;
}

namespace beamline {

// The KV budget of --gpu-memory-utilization on the CPU backend: that fraction of this many bytes
// (vLLM's CPU backend default KV space).
inline constexpr int64_t kCpuKvCacheDefaultBytes = int64_t{4} << 30;
// Kept free on a device beyond the weights when sizing the KV cache from --gpu-memory-utilization: one step's
// activations, scratch and cuBLAS workspaces.
inline constexpr int64_t kDeviceActivationHeadroomBytes = int64_t{4} << 30;

struct EngineConfig {
  int32_t max_num_seqs = 256;             // --max-num-seqs: sequences running at once
  int32_t max_num_batched_tokens = 8192;  // --max-num-batched-tokens: tokens per forward step
  int64_t max_model_len = 0;              // --max-model-len: prompt + output; 0 = the model's max_position_embeddings
                                          //   (or less: what the KV cache can hold)
  int32_t block_size = 0;                 // --block-size: tokens per KV block; 0 = the model's default
  bool enable_prefix_caching = true;      // --enable-prefix-caching / --no-enable-prefix-caching
  int64_t kv_cache_memory_bytes = 0;      // --kv-cache-memory: KV budget in bytes; 0 = use the fraction
  double gpu_memory_utilization = 0.9;    // --gpu-memory-utilization
  uint64_t seed = 0;                      // --seed: for requests without their own seed
  int32_t max_logprobs = 20;              // --max-logprobs: top_logprobs limit per token
  LogprobsMode logprobs_mode = LogprobsMode::RawLogprobs;  // --logprobs-mode: what logprobs report (logprobs_mode.h)
  std::string dtype = "auto";             // --dtype: tensor-core operand precision (Backend::set_compute_dtype)
  std::string kv_cache_dtype = "auto";    // --kv-cache-dtype: the paged KV pool's storage type
  bool calculate_kv_scales = false;       // --calculate-kv-scales: FP8 KV scales from the first step (BeamModel)
  bool enforce_eager = false;             // --enforce-eager: no recorded decode graphs (runner/decode_graphs.h)
  bool async_scheduling = true;           // --async-scheduling: schedule step N+1 while step N runs (engine_core.h)
  SpeculativeConfig speculative;          // --speculative-config: draft tokens verified per step (engine_core.h)
  bool jump_forward = true;               // --jump-forward: a constrained output's forced tokens as a draft (engine_core.h)
  bool enable_return_routed_experts = false;  // --enable-return-routed-experts: capture the router's choices (docs/rl.md)
  bool batch_invariant = false;           // --batch-invariant: a row's results never depend on its batch (docs/rl.md)
  // LoRA (docs/lora.md), vLLM's flags: --enable-lora, --max-loras (adapters loaded at once, each in its slot),
  // --max-lora-rank, --lora-modules (adapters loaded at start).
  bool enable_lora = false;
  int32_t max_loras = 1;
  int64_t max_lora_rank = 16;
  struct LoraModulePath {
    std::string name, path;
  };
  std::vector<LoraModulePath> lora_modules;

  // Throws beamline::Error naming the flag of the first bad value.
  void validate() const;
};

// One --lora-modules value: name=path, or vLLM's JSON {"name", "path", "base_model_name"}. Error naming the flag.
EngineConfig::LoraModulePath parse_lora_module(std::string_view text);

// Registers the flags above on `command`, writing into `config`.
void add_engine_options(CLI::App& command, EngineConfig& config);

// --dtype, --kv-cache-dtype (backend.h's parse_compute_dtype / parse_kv_cache_dtype read them) and
// --calculate-kv-scales, for commands that run a model without the engine too.
void add_dtype_options(CLI::App& command, std::string& dtype, std::string& kv_cache_dtype, bool& calculate_kv_scales);
// --calculate-kv-scales is for an FP8 KV cache: Error naming both flags otherwise.
void check_calculate_kv_scales(bool calculate_kv_scales, std::string_view kv_cache_dtype);

// Parses a byte count: a plain integer or one with a K/M/G/T suffix (powers of 1024; "KiB", "GB" etc. too).
int64_t parse_byte_size(std::string_view text, std::string_view flag);

// The KV cache budget in bytes: --kv-cache-memory when given, else gpu_memory_utilization times the
// device's memory (`device_bytes`) less what is already used there (`used_bytes`).
int64_t kv_cache_budget_bytes(const EngineConfig& config, int64_t device_bytes, int64_t used_bytes);

}  // namespace beamline

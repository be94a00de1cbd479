#include "engine/engine_config.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace beamline {

void EngineConfig::validate() const {
  parse_compute_dtype(dtype, Device::Cpu);  // the names; what "auto" means waits for the backend
  parse_kv_cache_dtype(kv_cache_dtype, ComputeDType::Float32);
  check_calculate_kv_scales(calculate_kv_scales, kv_cache_dtype);
  require(max_num_seqs >= 1, "--max-num-seqs must be at least 1 (got {})", max_num_seqs);
  require(max_num_batched_tokens >= max_num_seqs,
          "--max-num-batched-tokens ({}) must be at least --max-num-seqs ({}): every running sequence needs a "
          "token of each step's budget",
          max_num_batched_tokens, max_num_seqs);
  require(max_model_len >= 0, "--max-model-len must be positive (got {})", max_model_len);
  require(block_size == 0 || (block_size > 0 && 512 % block_size == 0),
          "--block-size must divide 512 (got {})", block_size);
  require(kv_cache_memory_bytes >= 0, "--kv-cache-memory must not be negative (got {})", kv_cache_memory_bytes);
  require(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1,
          "--gpu-memory-utilization must be in (0, 1] (got {})", gpu_memory_utilization);
  require(max_logprobs >= 0, "--max-logprobs must not be negative (got {})", max_logprobs);
  require(logprobs_mode == LogprobsMode::RawLogprobs || !speculative.enabled(),
          "--logprobs-mode {} with --speculative-config is not supported (draft verification reports raw_logprobs only)",
          to_string(logprobs_mode));
  // A draft's rows route tokens that may be rejected; their positions would be routed again.
  require(!enable_return_routed_experts || !speculative.enabled(),
          "--enable-return-routed-experts with --speculative-config is not supported");
  require(max_loras >= 1, "--max-loras must be at least 1 (got {})", max_loras);
  require(max_lora_rank >= 1, "--max-lora-rank must be at least 1 (got {})", max_lora_rank);
  require(enable_lora || lora_modules.empty(), "--lora-modules needs --enable-lora");
  require(static_cast<int64_t>(lora_modules.size()) <= max_loras,
          "--lora-modules names {} adapters, more than --max-loras {}", lora_modules.size(), max_loras);
  require(!enable_lora || !speculative.enabled(), "--enable-lora with --speculative-config is not supported");
}

EngineConfig::LoraModulePath parse_lora_module(std::string_view text) {
  EngineConfig::LoraModulePath module;
  if (text.starts_with("{")) {  // vLLM's JSON form; its base_model_name is not needed (one model is served)
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& error) {
      fail("--lora-modules: invalid JSON {}: {}", text, error.what());
    }
    const json_fields::Location where("--lora-modules", "");
    json_fields::expect_object(json, where);
    module.name = json_fields::required_string(json, "name", where);
    module.path = json_fields::required_string(json, "path", where);
  } else {
    const std::size_t equals = text.find('=');
    require(equals != std::string_view::npos && equals > 0 && equals + 1 < text.size(),
            "--lora-modules: '{}' is not name=path or a JSON object", text);
    module.name = std::string(text.substr(0, equals));
    module.path = std::string(text.substr(equals + 1));
  }
  return module;
}

int64_t parse_byte_size(std::string_view text, std::string_view flag) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  int64_t value = 0;
  const auto parsed = std::from_chars(text.data(), text.data() + digits, value);
  require(digits > 0 && parsed.ec == std::errc(), "{}: '{}' is not a byte count (e.g. 4294967296, 512MiB, 4G)", flag,
          text);
  std::string suffix;
  for (char c : text.substr(digits)) {
    if (c != ' ') suffix.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  }
  if (suffix.ends_with("IB")) suffix.erase(suffix.size() - 2);
  else if (suffix.size() == 2 && suffix.back() == 'B') suffix.pop_back();
  else if (suffix == "B") suffix.clear();
  int shift = 0;
  if (suffix == "K") shift = 10;
  else if (suffix == "M") shift = 20;
  else if (suffix == "G") shift = 30;
  else if (suffix == "T") shift = 40;
  else require(suffix.empty(), "{}: unknown unit in '{}' (use K, M, G or T)", flag, text);
  require(value <= (INT64_MAX >> shift), "{}: '{}' is too large", flag, text);
  return value << shift;
}

int64_t kv_cache_budget_bytes(const EngineConfig& config, int64_t device_bytes, int64_t used_bytes) {
  if (config.kv_cache_memory_bytes > 0) return config.kv_cache_memory_bytes;
  const auto budget = static_cast<int64_t>(config.gpu_memory_utilization * static_cast<double>(device_bytes)) - used_bytes;
  require(budget > 0,
          "--gpu-memory-utilization {} of {} bytes leaves no room for the KV cache ({} bytes already used); raise it "
          "or pass --kv-cache-memory",
          config.gpu_memory_utilization, device_bytes, used_bytes);
  return budget;
}

void add_engine_options(CLI::App& command, EngineConfig& config) {
  command.add_option("--max-num-seqs", config.max_num_seqs, "Most sequences running at once")
      ->capture_default_str();
  command.add_option("--max-num-batched-tokens", config.max_num_batched_tokens,
                     "Token budget of one forward step (chunked prefill splits longer prompts)")
      ->capture_default_str();
  command.add_option("--max-model-len", config.max_model_len,
                     "Longest prompt + output in tokens (default: the model's max_position_embeddings)");
  command.add_option("--block-size", config.block_size,
                     "Tokens per KV block, a divisor of 512 (default: 16, or what divides the sliding window)");
  command.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", config.enable_prefix_caching,
                   "Reuse the KV of cached prompt prefixes (default on)");
  command
      .add_option_function<std::string>(
          "--kv-cache-memory,--kv-cache-memory-bytes",
          [&config](const std::string& text) { config.kv_cache_memory_bytes = parse_byte_size(text, "--kv-cache-memory"); },
          "KV cache size in bytes (suffixes K, M, G, T allowed); overrides --gpu-memory-utilization")
      ->type_name("BYTES");
  command.add_option("--gpu-memory-utilization", config.gpu_memory_utilization,
                     "Fraction of device memory for weights and KV cache; on the CPU backend the KV cache gets this "
                     "fraction of 4 GiB")
      ->capture_default_str();
  command.add_option("--seed", config.seed, "Random seed for requests that do not set one")->capture_default_str();
  command.add_option("--max-logprobs", config.max_logprobs, "Largest top_logprobs / logprobs a request may ask for")
      ->capture_default_str();
  command
      .add_option_function<std::string>(
          "--logprobs-mode", [&config](const std::string& text) { config.logprobs_mode = parse_logprobs_mode(text); },
          "What logprobs report: raw_logprobs (default), processed_logprobs, raw_logits, processed_logits (vLLM's)");
  add_dtype_options(command, config.dtype, config.kv_cache_dtype, config.calculate_kv_scales);
  command.add_flag("--enforce-eager", config.enforce_eager,
                   "Run every step op by op: no recorded CUDA graphs for decode steps");
  command.add_flag("--async-scheduling,!--no-async-scheduling", config.async_scheduling,
                   "Schedule and launch the next step while the device runs the current one; its decode tokens are "
                   "read on the device from this step's samples (default on; --no-async-scheduling for the synchronous "
                   "loop)");
  command.add_flag("--jump-forward,!--no-jump-forward", config.jump_forward,
                   "Structured outputs: where the grammar forces the next bytes (JSON keys and punctuation, Harmony "
                   "headers), their tokens join the next step as a draft that the model verifies, so one step can emit "
                   "several; outputs stay exactly those without it (default on; --no-jump-forward turns it off)");
  command
      .add_option_function<std::string>(
          "--speculative-config",
          [&config](const std::string& text) { config.speculative = parse_speculative_config(text); },
          "Speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
          "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5}' drafts from the context and verifies them in the "
          "target's step (outputs stay the target's exactly); '{\"method\": \"dflash\", \"model\": DIR, "
          "\"num_speculative_tokens\": 7}' proposes a block from a block drafter (docs/speculative-decoding.md); none turns "
          "it off (the default, except for the default model, which speculates with models/beam-nano-drafter)")
      ->type_name("JSON");
  command.add_flag("--enable-return-routed-experts", config.enable_return_routed_experts,
                   "Routing replay: capture the router's top-k expert ids of every MoE layer, returned to requests "
                   "that set return_routed_experts (SGLang's names; docs/rl.md)");
  command.add_flag("--enable-lora", config.enable_lora,
                   "Serve LoRA adapters (PEFT), chosen per request by model name, also on the experts (docs/lora.md)");
  command.add_option("--max-loras", config.max_loras, "LoRA adapters loaded at once (each in its own slot)")
      ->capture_default_str();
  command.add_option("--max-lora-rank", config.max_lora_rank, "The largest LoRA rank served")->capture_default_str();
  command
      .add_option_function<std::vector<std::string>>(
          "--lora-modules",
          [&config](const std::vector<std::string>& modules) {
            for (const std::string& module : modules) config.lora_modules.push_back(parse_lora_module(module));
          },
          "LoRA adapters to load at start: name=path ... or vLLM's JSON '{\"name\": .., \"path\": ..}'")
      ->type_name("NAME=PATH")
      ->expected(1, -1);
  // vLLM turns the mode on with the environment variable VLLM_BATCH_INVARIANT=1: honoured here too, as the flag's
  // default (--batch-invariant=false still turns it off).
  if (const char* invariant = std::getenv("VLLM_BATCH_INVARIANT"); invariant != nullptr && std::string_view(invariant) == "1")
    config.batch_invariant = true;
  command.add_flag("--batch-invariant", config.batch_invariant,
                   "Batch-invariant mode (vLLM's VLLM_BATCH_INVARIANT, also read from the environment): a request's "
                   "tokens and logprobs are bit-identical whatever shares its batch; the cpu backend always is, cuda "
                   "runs row-invariant kernels (docs/rl.md, docs/cuda-backend.md)");
}

void check_calculate_kv_scales(bool calculate_kv_scales, std::string_view kv_cache_dtype) {
  require(!calculate_kv_scales || parse_kv_cache_dtype(kv_cache_dtype, ComputeDType::Float32) == DType::F8_E4M3,
          "--calculate-kv-scales sets the scales of an FP8 KV cache; --kv-cache-dtype is \"{}\" (use fp8)",
          kv_cache_dtype);
}

void add_dtype_options(CLI::App& command, std::string& dtype, std::string& kv_cache_dtype, bool& calculate_kv_scales) {
  command
      .add_option("--dtype", dtype,
                  "Precision of activations on the matrix units: auto (bfloat16 on cuda, float32 on cpu), bfloat16, "
                  "or float32 (FP32 products from three BF16 operands per activation, three times the tensor-core work)")
      ->capture_default_str();
  command
      .add_option("--kv-cache-dtype,--kv-dtype", kv_cache_dtype,
                  "KV cache storage: auto (the compute dtype of --dtype), bfloat16, float32 or fp8 (E4M3 with "
                  "per-layer k_scale / v_scale: the checkpoint's, else 1.0, or --calculate-kv-scales)")
      ->capture_default_str();
  command.add_flag("--calculate-kv-scales", calculate_kv_scales,
                   "With --kv-cache-dtype fp8: each layer's k_scale and v_scale from the first step's K and V "
                   "(max|k| / 200, max|v| / 100, vLLM's), kept from then on; overrides the checkpoint's");
}

}  // namespace beamline

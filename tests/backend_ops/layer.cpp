// One full-width decoder layer (attention + MoE) of a preset in perf mode (`perf layer`): on the CUDA backend, with
// random weights drawn on the device (no checkpoint on disk), for decode batches over a cached context; prints a
// Markdown table next to the HBM floor (bytes that must be read / 4.8 TB/s, PERF.md). Its ops are each in test mode
// in their own family; the layer has no test of its own (the whole model is checked by bench/gpu_check.sh).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "model/beam_model.h"
#include "op_families.h"
#include "perf.h"

namespace beamline::backend_ops {
namespace {

struct PerfOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> batches{1, 64};
  int64_t context = 4096;
  int64_t iterations = 20;
  uint64_t seed = 1;
  int64_t query_rows = 1;  // rows per sequence: 1 decodes, more are a prefill chunk ending at the context
  std::string dtype = "float32";
  bool batch_invariant = false;
};

#ifdef BEAMLINE_HAVE_CUDA

void check(cudaError_t status, const char* what) { check_cuda(status, "layer", what); }

void run_perf(const PerfOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(config.n_routed_experts > 0, "perf layer: preset {} has no MoE layers", options.preset);
  require(options.context >= 1 && options.iterations >= 1, "perf layer: --context and --iterations must be >= 1");
  require(options.query_rows >= 1 && options.query_rows <= options.context + 1,
          "perf layer: --query-rows must be in [1, --context + 1]");
  CudaBackend backend;
  backend.set_compute_dtype(parse_compute_dtype(options.dtype, backend.device()));
  backend.set_batch_invariant(options.batch_invariant);
  const int64_t hidden = config.hidden_size, heads = config.num_attention_heads, kv_heads = config.num_key_value_heads,
                dim = config.head_dim, experts = config.n_routed_experts, intermediate = config.moe_intermediate_size,
                top_k = config.num_experts_per_tok;
  uint64_t seed = options.seed;
  auto weight = [&](std::vector<int64_t> shape, float scale, DType dtype = DType::BF16) {
    return backend.random_weight(dtype, std::move(shape), seed++, 0.0f, scale);
  };
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  const Tensor input_norm = weight({hidden}, 1.0f), post_attention_norm = weight({hidden}, 1.0f);
  const Tensor pre_feedforward_norm = weight({hidden}, 1.0f), post_feedforward_norm = weight({hidden}, 1.0f);
  const LinearTensors q_proj{weight({heads * dim, hidden}, in_scale), {}, {}};
  const LinearTensors k_proj{weight({kv_heads * dim, hidden}, in_scale), {}, {}};
  const LinearTensors v_proj{weight({kv_heads * dim, hidden}, in_scale), {}, {}};
  const LinearTensors o_proj{weight({hidden, heads * dim}, 1.0f / std::sqrt(static_cast<float>(heads * dim))), {}, {}};
  const MoeTensors moe = random_moe_layer(backend, config, seed, 0.05f, 0.01f);
  const RouterParams router = router_params(config);
  const auto eps = static_cast<float>(config.rms_norm_eps);
  const auto residual_scale = static_cast<float>(config.residual_scale);

  const int32_t block_size = 16;
  const int64_t max_batch = *std::max_element(options.batches.begin(), options.batches.end());
  const int64_t blocks_per_sequence = (options.context + 1 + block_size - 1) / block_size;
  const std::vector<int64_t> pool_shape{max_batch * blocks_per_sequence, 1, block_size, kv_heads, dim};
  PagedKvPool pool{weight(pool_shape, 1.0f), weight(pool_shape, 1.0f)};
  spdlog::info("perf layer: {} layer on {}, KV pool {:.2f} GiB, --dtype {}{}, {} row(s) per sequence", options.preset,
               backend.device_description(), 2.0 * static_cast<double>(pool.k.nbytes()) / (1ull << 30), options.dtype,
               options.batch_invariant ? ", batch-invariant" : "", options.query_rows);

  cudaEvent_t marks[4];
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");
  std::printf("\n| layer | batch | context | attention ms (input norm to o) | MoE ms (add + norm + route, experts) | "
              "layer ms | layer floor ms | floor / layer | experts hit |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const bool sliding : {true, false}) {
    for (const int64_t sequences : options.batches) {
      const int64_t batch = sequences * options.query_rows;  // rows
      std::vector<int32_t> positions, query_start{0}, seq_lens, table;
      for (int64_t s = 0; s < sequences; ++s) {
        for (int64_t p = options.context + 1 - options.query_rows; p <= options.context; ++p)
          positions.push_back(static_cast<int32_t>(p));
        query_start.push_back(static_cast<int32_t>(positions.size()));
        seq_lens.push_back(static_cast<int32_t>(options.context + 1));
        for (int64_t b = 0; b < blocks_per_sequence; ++b) table.push_back(static_cast<int32_t>(s * blocks_per_sequence + b));
      }
      const AttentionBatch attention_batch = backend.make_attention_batch(positions, query_start, seq_lens);
      const Tensor block_table = backend.upload_i32(table, {sequences, blocks_per_sequence});
      std::vector<float> x_values(static_cast<std::size_t>(batch * hidden));
      for (std::size_t i = 0; i < x_values.size(); ++i) x_values[i] = std::sin(static_cast<float>(i) * 0.37f);
      Tensor x = backend.upload_f32(x_values, {batch, hidden});
      Tensor h = backend.alloc(DType::F32, {batch, hidden}), branch = backend.alloc(DType::F32, {batch, hidden});
      Tensor q = backend.alloc(DType::F32, {batch, heads * dim}), attention = backend.alloc(DType::F32, {batch, heads * dim});
      Tensor k = backend.alloc(DType::F32, {batch, kv_heads * dim}), v = backend.alloc(DType::F32, {batch, kv_heads * dim});
      Tensor ids = backend.alloc(DType::I32, {batch, top_k}), weights = backend.alloc(DType::F32, {batch, top_k});
      AttentionParams params;
      params.num_heads = static_cast<int32_t>(heads);
      params.num_kv_heads = static_cast<int32_t>(kv_heads);
      params.head_dim = static_cast<int32_t>(dim);
      params.scale = 1.0f / std::sqrt(static_cast<float>(dim));
      params.sliding_window = sliding ? static_cast<int32_t>(config.sliding_window) : 0;

      auto step = [&](bool timed) {
        if (timed) check(cudaEventRecord(marks[0], backend.stream()), "cudaEventRecord");
        backend.rms_norm(x, input_norm, eps, h);
        const std::array<const LinearTensors*, 3> qkv_weights{&q_proj, &k_proj, &v_proj};
        const std::array<Tensor*, 3> qkv{&q, &k, &v};
        backend.linear_many(h, qkv_weights, qkv);
        if (sliding) {
          backend.rope_qk(q, k, attention_batch.positions, params.num_heads, params.num_kv_heads, params.head_dim,
                          static_cast<float>(config.rope_theta));
        } else {
          backend.ssmax_scale(q, attention_batch.positions, static_cast<float>(config.ssmax_base),
                              static_cast<float>(config.ssmax_exponent));
        }
        backend.write_kv(k, v, pool, 0, block_table, attention_batch);
        backend.paged_attention(q, pool, block_table, attention_batch, params, attention);
        backend.linear(attention, o_proj, branch);
        if (timed) check(cudaEventRecord(marks[1], backend.stream()), "cudaEventRecord");
        backend.add_rms_norm_then_route(x, branch, post_attention_norm, eps, residual_scale, pre_feedforward_norm, h,
                                        moe.router, moe.router_bias, router, ids, weights);
        backend.moe(h, ids, weights, moe, branch);
        if (timed) check(cudaEventRecord(marks[2], backend.stream()), "cudaEventRecord");
        backend.add_rms_norm(x, branch, post_feedforward_norm, eps, residual_scale);
        if (timed) check(cudaEventRecord(marks[3], backend.stream()), "cudaEventRecord");
      };
      for (int i = 0; i < 3; ++i) step(false);
      std::vector<double> attention_ms, moe_ms, layer_ms;
      for (int64_t i = 0; i < options.iterations; ++i) {
        step(true);
        check(cudaEventSynchronize(marks[3]), "cudaEventSynchronize");
        float a = 0, m = 0, l = 0;
        check(cudaEventElapsedTime(&a, marks[0], marks[1]), "cudaEventElapsedTime");
        check(cudaEventElapsedTime(&m, marks[1], marks[2]), "cudaEventElapsedTime");
        check(cudaEventElapsedTime(&l, marks[0], marks[3]), "cudaEventElapsedTime");
        attention_ms.push_back(a);
        moe_ms.push_back(m);
        layer_ms.push_back(l);
      }
      const std::vector<int32_t> routed = backend.download_i32(ids);
      const std::set<int32_t> hit(routed.begin(), routed.end());
      const int64_t visible = sliding ? std::min<int64_t>(options.context + 1, config.sliding_window) : options.context + 1;
      const double weight_bytes =
          2.0 * static_cast<double>(hidden) * static_cast<double>((heads + 2 * kv_heads) * dim + heads * dim) +
          4.0 * static_cast<double>(experts * hidden) +
          2.0 * 3.0 * static_cast<double>(hidden * intermediate) * static_cast<double>(hit.size());
      const double kv_bytes = 2.0 * 2.0 * static_cast<double>(sequences * visible * kv_heads * dim);
      const double floor_ms = (weight_bytes + kv_bytes) / kHbmBytesPerSecond * 1e3;
      const double layer = median(layer_ms);
      std::printf("| %s | %lld | %lld | %.3f | %.3f | %.3f | %.3f | %.2f | %zu |\n", sliding ? "sliding (RoPE, window)" : "global (SSMax)",
                  static_cast<long long>(batch), static_cast<long long>(options.context), median(attention_ms),
                  median(moe_ms), layer, floor_ms, floor_ms / layer, hit.size());
    }
  }
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);
  const cuda::AllocatorStats stats = backend.allocator_stats();
  std::printf("\n%lld device allocations after warm-up and %lld timed steps per case (cached blocks are reused)\n",
              static_cast<long long>(stats.device_allocations), static_cast<long long>(options.iterations));
}
#endif

}  // namespace

void add_layer_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "layer", "Time one full-width decoder layer (attention + MoE) of a preset on the GPU with random "
                     "on-device weights, per decode batch, next to the HBM floor");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--batch", options->batches, "decode batch sizes")->delimiter(',')->capture_default_str();
  command->add_option("--context", options->context, "cached positions per sequence")->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed steps per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->add_option("--query-rows", options->query_rows,
                      "rows per sequence (1: decode; more: a prefill chunk ending at the context); the batch column "
                      "counts rows")
      ->capture_default_str();
  command->add_option("--dtype", options->dtype, "compute dtype (float32 or bfloat16)")->capture_default_str();
  command->add_flag("--batch-invariant", options->batch_invariant, "batch-invariant mode (Backend::set_batch_invariant)");
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("layer");
#endif
  });
}

}  // namespace beamline::backend_ops

// Projections in both modes. Test: linear (Beam-1.0's projections, 1-16 rows over one weight, odd widths), q|k|v in
// one linear_many, the dense SwiGLU MLP and the LM head, each at the tolerance of the path the row count takes
// (streamed weights exact, the matrix units at the operand tolerance). Perf (`perf linear`): the non-MoE weight
// reads of one decode step of a preset on the CUDA backend, per row count: a layer's q|k|v (linear_many) and o
// projections, a dense SwiGLU MLP and the LM head (soft cap included), each through the weight-streaming kernels
// (the backend's path for few rows) and through cuBLAS (the path for many rows) with split operands (--dtype
// float32) and with BF16 ones (--dtype bfloat16), replayed as CUDA graphs; prints a Markdown table next to the HBM
// floor (the weight bytes read once / 4.8 TB/s, PERF.md). Weights smaller than a few L2s are drawn in several
// copies that the graph cycles through, so that every replay reads them from HBM as a decode step does.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "harness.h"
#include "op_families.h"
#include "perf.h"

namespace beamline::backend_ops {

namespace {

// Float32 only: projections whose result lies in the activations' low bits (Inputs::low_bit_pairs against
// pair_sign_weight weights), exact in FP32 in any order, so the split operands must carry all 19 bits of every
// activation (three BF16 terms do; two fail by ~1e-3). More rows than are streamed: cuBLAS over the split rows.
void test_linear_low_bits(Harness& harness) {
  if (harness.device().compute_dtype() != ComputeDType::Float32) return;
  for (const int64_t rows : {2L, 16L, 300L})
    for (const int64_t in : {32L, 30L}) {
      const auto start = std::chrono::steady_clock::now();
      const int64_t out = 48;
      auto weight = harness.weight(harness.inputs().pair_sign_weight(out, in));
      auto x = harness.f32(harness.inputs().low_bit_pairs(rows, in), {rows, in});
      auto y = harness.poisoned(DType::F32, {rows, out});
      harness.device().linear(x.device, {weight.device, {}, {}}, y.device);
      harness.reference().linear(x.reference, {weight.reference, {}, {}}, y.reference);
      harness.record("linear", fmt::format("T {} {}x{} BF16 (low bits: the split's third term)", rows, out, in), y,
                     kLowBitsTolerance, seconds_since(start));
    }
}

}  // namespace

void test_linear(Harness& harness) {
  struct Case {
    int64_t rows, in, out;
    DType dtype;
    const char* what;
  };
  std::vector<Case> cases{{1, 5120, 6144, DType::BF16, "q, decode"},   {64, 5120, 1024, DType::BF16, "k|v"},
                          {300, 6144, 5120, DType::BF16, "o, prefill"}, {13, 333, 77, DType::BF16, "odd"},
                          {5, 96, 40, DType::F32, "F32 weight"}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 3);
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    auto weight = harness.random_weight(c.dtype, {c.out, c.in}, 1.0f / std::sqrt(static_cast<float>(c.in)));
    auto x = harness.f32(harness.inputs().uniform(c.rows * c.in), {c.rows, c.in});
    auto y = harness.poisoned(DType::F32, {c.rows, c.out});
    harness.device().linear(x.device, {weight.device, {}, {}}, y.device);
    harness.reference().linear(x.reference, {weight.reference, {}, {}}, y.reference);
    harness.record("linear", fmt::format("T {} {}x{} {} ({})", c.rows, c.out, c.in, dtype_name(c.dtype), c.what), y,
                   harness.projection_tolerance(c.rows, c.in, c.dtype, kStreamingSingleRows), seconds_since(start));
  }
  test_linear_low_bits(harness);
}

// Projections of 1 to 16 rows (streamed up to kStreamingSingleRows, cuBLAS above) over one weight per shape: Beam-1.0's o
// and k (too few rows to fill the GPU alone: the warps split each row), and odd ones (a width that is no multiple
// of a warp's 256-element step, a split row with a ragged end, a single output, F16).
void test_linear_rows(Harness& harness) {
  struct Case {
    int64_t in, out;
    DType dtype;
    const char* what;
  };
  std::vector<Case> cases{{6144, 5120, DType::BF16, "o"},      {5120, 1024, DType::BF16, "k"},
                          {520, 77, DType::BF16, "odd"},       {4104, 77, DType::BF16, "odd, split rows"},
                          {8, 1, DType::BF16, "one output"},   {1032, 333, DType::F16, "F16"}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 2);
  for (const Case& c : cases) {
    auto weight = harness.random_weight(c.dtype, {c.out, c.in}, 1.0f / std::sqrt(static_cast<float>(c.in)));
    for (int64_t rows : {1L, 2L, 3L, 4L, 5L, 8L, 9L, 13L, 16L}) {
      const auto start = std::chrono::steady_clock::now();
      auto x = harness.f32(harness.inputs().uniform(rows * c.in), {rows, c.in});
      auto y = harness.poisoned(DType::F32, {rows, c.out});
      harness.device().linear(x.device, {weight.device, {}, {}}, y.device);
      harness.reference().linear(x.reference, {weight.reference, {}, {}}, y.reference);
      harness.record("linear", fmt::format("T {} {}x{} {} ({})", rows, c.out, c.in, dtype_name(c.dtype), c.what), y,
                     harness.projection_tolerance(rows, c.in, c.dtype, kStreamingSingleRows), seconds_since(start));
    }
  }
}

// q|k|v in one op: Beam-1.0's widths, and odd ones; each output against the reference's.
void test_linear_many(Harness& harness) {
  struct Case {
    int64_t in;
    std::vector<int64_t> outs;
    std::vector<int64_t> rows;
  };
  std::vector<Case> cases{{5120, {6144, 1024, 1024}, {1, 2, 4, 7, 16, 64}}, {520, {77, 5, 130}, {1, 3, 16, 17}}};
  if (harness.small_only()) cases.erase(cases.begin());
  for (const Case& c : cases) {
    std::vector<Harness::Pair> weights;
    for (int64_t out : c.outs)
      weights.push_back(harness.random_weight(DType::BF16, {out, c.in}, 1.0f / std::sqrt(static_cast<float>(c.in))));
    for (int64_t rows : c.rows) {
      const auto start = std::chrono::steady_clock::now();
      auto x = harness.f32(harness.inputs().uniform(rows * c.in), {rows, c.in});
      std::vector<Harness::Pair> ys;
      std::vector<LinearTensors> device_weights, reference_weights;
      for (std::size_t i = 0; i < c.outs.size(); ++i) {
        ys.push_back(harness.poisoned(DType::F32, {rows, c.outs[i]}));
        device_weights.push_back({weights[i].device, {}, {}});
        reference_weights.push_back({weights[i].reference, {}, {}});
      }
      std::vector<const LinearTensors*> device_list, reference_list;
      std::vector<Tensor*> device_ys, reference_ys;
      for (std::size_t i = 0; i < c.outs.size(); ++i) {
        device_list.push_back(&device_weights[i]);
        reference_list.push_back(&reference_weights[i]);
        device_ys.push_back(&ys[i].device);
        reference_ys.push_back(&ys[i].reference);
      }
      harness.device().linear_many(x.device, device_list, device_ys);
      harness.reference().linear_many(x.reference, reference_list, reference_ys);
      for (std::size_t i = 0; i < c.outs.size(); ++i)
        harness.record("linear_many", fmt::format("T {} {}x{}, output {} of {}", rows, c.outs[i], c.in, i + 1,
                                                  c.outs.size()),
                       ys[i], harness.projection_tolerance(rows, c.in, DType::BF16, kStreamingRows),
                       seconds_since(start));
    }
  }
}

void test_swiglu(Harness& harness) {
  struct Case {
    int64_t hidden, intermediate;
    std::vector<int64_t> rows;
  };
  // One row streams the weights through the experts' kernels (gate|up with the SwiGLU fused, then down); more rows
  // and the odd widths take cuBLAS.
  std::vector<Case> cases{{5120, 20480, {1, 2, 5, 8, 9, 16, 64}}, {520, 136, {1, 3, 16, 17}}, {100, 36, {1, 65}}};
  if (harness.small_only()) cases.erase(cases.begin());
  for (const Case& c : cases) {
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(c.hidden));
    auto gate = harness.random_weight(DType::BF16, {c.intermediate, c.hidden}, in_scale);
    auto up = harness.random_weight(DType::BF16, {c.intermediate, c.hidden}, in_scale);
    auto down = harness.random_weight(DType::BF16, {c.hidden, c.intermediate},
                                      1.0f / std::sqrt(static_cast<float>(c.intermediate)));
    for (int64_t rows : c.rows) {
      const auto start = std::chrono::steady_clock::now();
      auto h = harness.f32(harness.inputs().uniform(rows * c.hidden), {rows, c.hidden});
      auto out = harness.poisoned(DType::F32, {rows, c.hidden});
      harness.device().swiglu(h.device, {{gate.device, {}, {}}, {up.device, {}, {}}, {down.device, {}, {}}},
                              out.device);
      harness.reference().swiglu(h.reference,
                                 {{gate.reference, {}, {}}, {up.reference, {}, {}}, {down.reference, {}, {}}},
                                 out.reference);
      const bool streamed = rows <= kStreamingSingleRows && c.hidden % 8 == 0 && c.intermediate % 8 == 0;
      harness.record("swiglu", fmt::format("T {} H {} I {}", rows, c.hidden, c.intermediate), out,
                     streamed ? kF32Tolerance : harness.operand_tolerance(), seconds_since(start));
    }
  }
}

void test_lm_head(Harness& harness) {
  struct Case {
    int64_t vocab, hidden;
    float softcap;
    std::vector<int64_t> selected;
  };
  std::vector<Case> cases{{201088, 5120, 30.0f, {1, 3, 16, 17}}, {1000, 96, 0.0f, {3}}, {4097, 64, 30.0f, {1, 3, 16}},
                          {1003, 100, 30.0f, {3}}};
  if (harness.small_only()) cases.erase(cases.begin());
  for (const Case& c : cases) {
    const int64_t rows = 20;
    auto head = harness.random_weight(DType::BF16, {c.vocab, c.hidden}, 4.0f / std::sqrt(static_cast<float>(c.hidden)));
    auto norm = harness.random_weight(DType::BF16, {c.hidden}, 1.0f);
    for (int64_t count : c.selected) {
      const auto start = std::chrono::steady_clock::now();
      auto x = harness.f32(harness.inputs().uniform(rows * c.hidden, 2.0f), {rows, c.hidden});
      std::vector<int32_t> picked(static_cast<std::size_t>(count));
      for (int64_t i = 0; i < count; ++i) picked[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7 + 8) % rows);
      auto selected = harness.i32(picked, {count});
      auto logits = harness.poisoned(DType::F32, {count, c.vocab});
      harness.device().lm_head(x.device, selected.device, norm.device, 1e-6f, {head.device, {}, {}}, c.softcap,
                               logits.device);
      harness.reference().lm_head(x.reference, selected.reference, norm.reference, 1e-6f, {head.reference, {}, {}},
                                  c.softcap, logits.reference);
      harness.record("lm_head", fmt::format("rows {} of {} V {} H {} softcap {}", count, rows, c.vocab, c.hidden,
                                            c.softcap),
                     logits, harness.projection_tolerance(count, c.hidden, DType::BF16, kStreamingRows),
                     seconds_since(start));
    }
  }
}


// ---- perf ----

namespace {

struct PerfOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> rows{1, 2, 4, 16};
  int64_t iterations = 30;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA

// At least this many weight bytes per replay, so that L2 (60 MB on the H200) holds no weight between reads.
constexpr double kMinBytesPerReplay = 256e6;

// Median milliseconds of one call of `op`, captured `copies` times (one per weight copy) into a graph.
double time_copies(CudaBackend& backend, const std::function<void(int)>& op, int copies, int64_t iterations) {
  const auto all = [&] {
    for (int c = 0; c < copies; ++c) op(c);
  };
  return time_graph(backend, all, iterations, "linear") / copies;
}

void run_perf(const PerfOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(options.iterations >= 1, "perf linear: --iterations must be >= 1");
  CudaBackend backend;
  const int64_t hidden = config.hidden_size, q_width = config.num_attention_heads * config.head_dim,
                kv_width = config.num_key_value_heads * config.head_dim, intermediate = config.intermediate_size,
                vocab = config.vocab_size;
  uint64_t seed = options.seed;
  auto weight = [&](std::vector<int64_t> shape, float stddev) {
    return LinearTensors{backend.random_weight(DType::BF16, std::move(shape), seed++, 0.0f, stddev), {}, {}};
  };
  auto copies_for = [](double bytes) { return static_cast<int>(std::max(1.0, std::ceil(kMinBytesPerReplay / bytes))); };
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));

  const double qkv_bytes = 2.0 * static_cast<double>(hidden * (q_width + 2 * kv_width));
  const double o_bytes = 2.0 * static_cast<double>(q_width * hidden);
  const double mlp_bytes = 2.0 * 3.0 * static_cast<double>(hidden * intermediate);
  const double head_bytes = 2.0 * static_cast<double>(vocab * hidden);
  struct Attention {
    LinearTensors q, k, v, o;
  };
  std::vector<Attention> attention(static_cast<std::size_t>(copies_for(o_bytes)));
  for (Attention& a : attention) {
    a.q = weight({q_width, hidden}, in_scale);
    a.k = weight({kv_width, hidden}, in_scale);
    a.v = weight({kv_width, hidden}, in_scale);
    a.o = weight({hidden, q_width}, 1.0f / std::sqrt(static_cast<float>(q_width)));
  }
  const int qkv_copies = std::min(copies_for(qkv_bytes), static_cast<int>(attention.size()));
  const int o_copies = static_cast<int>(attention.size());
  std::vector<SwigluTensors> mlp(static_cast<std::size_t>(copies_for(mlp_bytes)));
  for (SwigluTensors& m : mlp) {
    m.gate = weight({intermediate, hidden}, in_scale);
    m.up = weight({intermediate, hidden}, in_scale);
    m.down = weight({hidden, intermediate}, 1.0f / std::sqrt(static_cast<float>(intermediate)));
  }
  const LinearTensors head = weight({vocab, hidden}, 4.0f * in_scale);
  const Tensor final_norm = backend.random_weight(DType::BF16, {hidden}, seed++, 0.0f, 1.0f);
  const auto eps = static_cast<float>(config.rms_norm_eps);
  const auto softcap = static_cast<float>(config.final_logit_softcapping);
  spdlog::info("perf linear: {} on {}; copies: q|k|v {}, o {}, MLP {}", options.preset, backend.device_description(),
               qkv_copies, o_copies, mlp.size());

  std::printf("\n| op | weights | rows | floor ms | streaming ms | streaming TB/s | floor / streaming | cuBLAS split "
              "ms | cuBLAS BF16 ms | cuBLAS BF16 / streaming |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | "
              "--- |\n");
  for (const int64_t rows : options.rows) {
    require(rows >= 1, "perf linear: --rows must be >= 1");
    const Tensor h = backend.random_weight(DType::F32, {rows, hidden}, seed++, 0.0f, 1.0f);
    const Tensor attended = backend.random_weight(DType::F32, {rows, q_width}, seed++, 0.0f, 1.0f);
    Tensor q = backend.alloc(DType::F32, {rows, q_width}), k = backend.alloc(DType::F32, {rows, kv_width}),
           v = backend.alloc(DType::F32, {rows, kv_width}), out = backend.alloc(DType::F32, {rows, hidden});
    std::vector<int32_t> picked(static_cast<std::size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) picked[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    const Tensor logit_rows = backend.upload_i32(picked, {rows});
    Tensor logits = backend.alloc(DType::F32, {rows, vocab});

    struct Op {
      const char* name;
      double bytes;
      int copies;
      int64_t streaming_rows;  // the most rows the backend streams the weights of this op for
      std::function<void(int)> run;
    };
    const std::array<Op, 4> ops{
        Op{"q, k, v (linear_many)", qkv_bytes, qkv_copies, CudaBackend::kStreamingMaxRows,
           [&](int c) {
             const Attention& a = attention[static_cast<std::size_t>(c)];
             const std::array<const LinearTensors*, 3> weights{&a.q, &a.k, &a.v};
             const std::array<Tensor*, 3> ys{&q, &k, &v};
             backend.linear_many(h, weights, ys);
           }},
        Op{"o", o_bytes, o_copies, CudaBackend::kStreamingSingleMaxRows,
           [&](int c) { backend.linear(attended, attention[static_cast<std::size_t>(c)].o, out); }},
        Op{"dense SwiGLU MLP", mlp_bytes, static_cast<int>(mlp.size()), CudaBackend::kStreamingSwigluMaxRows,
           [&](int c) { backend.swiglu(h, mlp[static_cast<std::size_t>(c)], out); }},
        Op{"LM head (norm + soft cap)", head_bytes, 1, CudaBackend::kStreamingMaxRows,
           [&](int) { backend.lm_head(h, logit_rows, final_norm, eps, head, softcap, logits); }},
    };
    for (const Op& op : ops) {
      backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
      const bool streams = rows <= op.streaming_rows;
      const double streaming_ms = streams ? time_copies(backend, op.run, op.copies, options.iterations) : 0.0;
      backend.set_streaming_max_rows(0);
      const double split_ms = time_copies(backend, op.run, op.copies, options.iterations);
      backend.set_compute_dtype(ComputeDType::BFloat16);
      const double bf16_ms = time_copies(backend, op.run, op.copies, options.iterations);
      backend.set_compute_dtype(ComputeDType::Float32);
      backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
      const double floor_ms = op.bytes / kHbmBytesPerSecond * 1e3;
      if (streams)
        std::printf("| %s | %.0f MB | %lld | %.4f | %.4f | %.2f | %.2f | %.4f | %.4f | %.2f |\n", op.name,
                    op.bytes / 1e6, static_cast<long long>(rows), floor_ms, streaming_ms,
                    op.bytes / (streaming_ms * 1e-3) / 1e12, floor_ms / streaming_ms, split_ms, bf16_ms,
                    bf16_ms / streaming_ms);
      else
        std::printf("| %s | %.0f MB | %lld | %.4f | — | — | — | %.4f | %.4f | — |\n", op.name, op.bytes / 1e6,
                    static_cast<long long>(rows), floor_ms, split_ms, bf16_ms);
    }
  }
}
#endif

}  // namespace

void add_linear_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "linear", "Time a decode step's dense weight reads (q|k|v, o, dense SwiGLU MLP, LM head) of a preset on "
                      "the GPU per row count, weight-streaming kernels next to cuBLAS, as CUDA graphs, next to the "
                      "HBM floor");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--rows", options->rows, "activation rows (decode batch)")->delimiter(',')->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("linear");
#endif
  });
}

}  // namespace beamline::backend_ops

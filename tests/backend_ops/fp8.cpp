// FP8 block-128 weights (MODEL_FORMAT.md section 5 "fp8"; the CUDA paths of backend/cuda/quant/fp8.h) in both
// modes. Test: the device's activation quantizer bit for bit, then linear, linear_many, lm_head, swiglu and moe with
// FP8 weights against the references below. Perf (`perf fp8`): random codes and scales drawn on the device. Two
// tables, every figure next to its floor (PERF.md: bytes incl. scales / 4.8 TB/s, and FLOPs / 1,341 TFLOP/s, the
// FP8 peak torch._scaled_mm reached on an H200; the larger of the two):
//  - one MoE layer of the preset (FP32 router with its group-limited top-k, then the FP8 experts) per token count,
//    replayed as a CUDA graph, as `perf moe` does for BF16;
//  - the dense projections per row count (q|k|v, o, the dense SwiGLU MLP, the LM head), as graphs over enough
//    weight copies that L2 holds none between reads; at the streamed row counts (W8A16) also the FP8 wgmma path
//    (W8A8) for comparison.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "harness.h"
#include "model/beam_model.h"
#include "op_families.h"
#include "perf.h"
#include "quant/activation_quant.h"
#include "quant/quantize.h"
#include "shard_parts.h"

namespace beamline::backend_ops {
namespace {

// Each output is held against two references on the CPU backend, both with the weights dequantized exactly
// (quant/quantize.h) as F32: (a) the W8A8 emulation, activations through quant/activation_quant.h's quantizer and
// back, FP32 sums: the device's W8A8 paths must match it up to summation order (kFp8EmulationTolerance); (b) the exact
// reference, F32 activations: the W8A16 streaming paths must match it up to summation order (kF32Tolerance), the W8A8
// ones within the E4M3 rounding of the activations (3 mantissa bits: a few percent relative).
// Not FP32's 1e-5: within each 128-wide k block Hopper's FP8 tensor cores accumulate with fewer bits than FP32 (the
// reason the partial sums are promoted per block), measured 1.1e-4 against the emulation on the H200 (2026-12-02).
constexpr double kFp8EmulationTolerance = 3e-4;
// Up to this many rows the CUDA backend streams FP8 weights with F32 activations (CudaBackend::kFp8StreamingMaxRows);
// a MoE streams one token.
constexpr int64_t kFp8StreamedRows = 1;
// A SwiGLU or MoE quantizes twice (h, then the SwiGLU output): where the device's SwiGLU output differs from the
// emulation's by rounding, a value next to an E4M3 rounding boundary can round the other way (one code, 1/16 relative
// of that one product), so the emulated pipelines get more room than one projection.
// Measured 2e-3 to 5.7e-3 on the H200 (the 1e-4 of each GEMM flips a few E4M3 codes of the SwiGLU output); a lost or
// doubled tile gives errors near 1.
constexpr double kFp8PipelineEmulationTolerance = 1.5e-2;
constexpr double kFp8ActivationTolerance = 6e-2;          // one E4M3 rounding of the activations (linear, lm_head)
constexpr double kFp8PipelineActivationTolerance = 8e-2;  // two (swiglu, moe)

// One FP8 weight on both backends: codes and scales on the device, the exact dequantization as F32 on the reference.
struct Fp8Weight {
  LinearTensors device;
  Tensor reference;  // F32 [out, in]
};

class Fp8Weights {
 public:
  explicit Fp8Weights(Harness& harness) : harness_(harness) {}
  Fp8Weight make(int64_t out, int64_t in, float scale) {
    const std::vector<float> values = harness_.inputs().uniform(out * in, scale);
    return upload(quantized_.emplace_back(quantize_weight(QuantScheme::Fp8Block, values, out, in)).view());
  }

  // One rank's part of a whole [out, in] weight, cut as checkpoint/shard_weights.cpp cuts it (quant/slice.h).
  Fp8Weight make_part(int64_t out, int64_t in, SliceAxis axis, int64_t begin, int64_t count, float scale) {
    const std::vector<float> values = harness_.inputs().uniform(out * in, scale);
    const QuantizedWeight& whole = quantized_.emplace_back(quantize_weight(QuantScheme::Fp8Block, values, out, in));
    if (axis == SliceAxis::Rows) return upload(quantized_rows(whole.view(), begin, count));
    return upload(quantized_.emplace_back(quantized_columns(whole.view(), begin, count)).view());
  }

 private:
  // `q`'s bytes (alive in quantized_) on the device, shaped by the layout of its own [out, in]; its exact
  // dequantization on the reference.
  Fp8Weight upload(const QuantizedWeightView& q) {
    const int64_t out = q.out_features, in = q.in_features;
    const std::vector<float>& exact = exact_.emplace_back(dequantize_weight(q));
    auto view = [](DType dtype, std::vector<int64_t> shape, const void* data, std::size_t bytes) {
      TensorView v;
      v.name = fmt::format("fp8 test {}", shape_string(shape));
      v.dtype = dtype;
      v.shape = std::move(shape);
      v.data = static_cast<const std::byte*>(data);
      v.nbytes = bytes;
      return v;
    };
    const int64_t scale_rows = (out + 127) / 128, scale_cols = (in + 127) / 128;
    Fp8Weight w;
    w.device.weight = harness_.device().load_weight(
        view(DType::F8_E4M3, {out, in}, q.codes, static_cast<std::size_t>(out * in)));
    w.device.scale = harness_.device().load_weight(view(DType::F32, {scale_rows, scale_cols}, q.scales,
                                                        static_cast<std::size_t>(scale_rows * scale_cols) * 4));
    w.reference = harness_.reference().load_weight(view(DType::F32, {out, in}, exact.data(), exact.size() * 4));
    return w;
  }

  Harness& harness_;
  std::deque<QuantizedWeight> quantized_;
  std::deque<std::vector<float>> exact_;
};

// x' = the activations through the reference quantizer and back.
std::vector<float> w8a8_activations(const std::vector<float>& x, int64_t rows, int64_t cols) {
  return dequantize_activations(quantize_activations(x, rows, cols));
}

// x W^T on the reference backend, for host vectors.
std::vector<float> reference_linear(Harness& harness, const std::vector<float>& x, int64_t rows, const Tensor& weight) {
  Tensor input = harness.reference().upload_f32(x, {rows, weight.dim(1)});
  Tensor y = harness.reference().alloc(DType::F32, {rows, weight.dim(0)});
  harness.reference().linear(input, {weight, {}, {}}, y);
  return harness.reference().download_f32(y);
}

float host_silu(float a) { return a / (1.0f + std::exp(-a)); }

// Records the device's `out` against both references; `streamed` paths are exact (W8A16), the others W8A8.
void record_fp8(Harness& harness, const std::string& op, const std::string& shape, const Tensor& out,
                const std::vector<float>* emulated, const std::vector<float>& exact, bool streamed, bool pipeline,
                double seconds) {
  auto record = [&](const std::vector<float>& ref, double tolerance, const char* what) {
    Result result{op, fmt::format("{} vs {}", shape, what), 0.0, tolerance, {}, false, seconds};
    result.error = relative_error(harness.device().download_f32(out), ref);
    result.passed = result.error <= tolerance;
    harness.record_result(std::move(result));
  };
  if (streamed) {
    record(exact, kF32Tolerance, "exact (W8A16 streamed)");
    return;
  }
  if (emulated != nullptr)
    record(*emulated, pipeline ? kFp8PipelineEmulationTolerance : kFp8EmulationTolerance, "W8A8 emulation");
  record(exact, pipeline ? kFp8PipelineActivationTolerance : kFp8ActivationTolerance, "exact (E4M3 activations)");
}

#ifdef BEAMLINE_HAVE_CUDA
// The device's activation quantizer bit for bit against quant/activation_quant.h: all-zero blocks, a ragged last
// block, huge and tiny values, NaN.
void test_fp8_quantize(Harness& harness) {
  auto* cuda = dynamic_cast<CudaBackend*>(&harness.device());
  if (cuda == nullptr) return;
  for (auto [rows, cols] : {std::pair{5L, 5120L}, {3L, 336L}, {64L, 2560L}, {2L, 16L}}) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> x = harness.inputs().uniform(rows * cols, 4.0f);
    std::fill(x.begin(), x.begin() + std::min<int64_t>(cols, 128), 0.0f);  // an all-zero block
    x[static_cast<std::size_t>(rows * cols - 1)] = 3e4f;                   // saturating neighbours stay finite
    if (cols > 200) x[static_cast<std::size_t>(cols + 130)] = 1e-30f;    // subnormal codes
    const QuantizedActivations expected = quantize_activations(x, rows, cols);
    Tensor input = cuda->upload_f32(x, {rows, cols});
    Tensor codes = cuda->alloc(DType::U8, {rows, cols});
    Tensor scales = cuda->alloc(DType::F32, {rows, expected.groups_per_row()});
    cuda->quantize_fp8_rows(input, codes, scales);
    std::vector<uint8_t> got_codes(expected.codes.size());
    cuda->download(codes, got_codes.data());
    const std::vector<float> got_scales = cuda->download_f32(scales);
    int64_t mismatches = 0;
    for (std::size_t i = 0; i < got_codes.size(); ++i) mismatches += got_codes[i] != expected.codes[i] ? 1 : 0;
    for (std::size_t i = 0; i < got_scales.size(); ++i)
      mismatches += std::memcmp(&got_scales[i], &expected.scales[i], 4) != 0 ? 1 : 0;
    Result result{"fp8_quantize", fmt::format("T {} C {}: codes and scales bit for bit", rows, cols),
                  static_cast<double>(mismatches), 0.0, fmt::format("{} mismatches", mismatches), mismatches == 0,
                  seconds_since(start)};
    harness.record_result(std::move(result));
  }
}
#else
void test_fp8_quantize(Harness&) {}
#endif

// One tensor-parallel rank's parts (shard_parts.h): codes and block scales cut from a whole weight by quant/slice.h,
// uploaded with the layout of the part's own shape (scale strides from the part), as a sharded model loads them.
void test_fp8_shard_parts(Harness& harness) {
  Fp8Weights weights(harness);
  for (const ShardPartCase& c : shard_part_cases(QuantScheme::Fp8Block, harness.small_only())) {
    const Fp8Weight w = weights.make_part(c.out, c.in, c.axis, c.begin, c.count,
                                          1.0f / std::sqrt(static_cast<float>(c.in)));
    const int64_t out = c.part_out(), in = c.part_in();
    for (int64_t rows : {1L, 4L, 64L}) {
      const auto start = std::chrono::steady_clock::now();
      const std::vector<float> x = harness.inputs().uniform(rows * in);
      Tensor xd = harness.device().upload_f32(x, {rows, in});
      auto y = harness.poisoned(DType::F32, {rows, out});
      harness.device().linear(xd, w.device, y.device);
      const std::vector<float> exact = reference_linear(harness, x, rows, w.reference);
      const std::vector<float> emulated = reference_linear(harness, w8a8_activations(x, rows, in), rows, w.reference);
      record_fp8(harness, "fp8_shard_linear",
                 fmt::format("T {} {} [{}, {}) of {}x{} ({})", rows, c.axis == SliceAxis::Rows ? "rows" : "columns",
                             c.begin, c.begin + c.count, c.out, c.in, c.what),
                 y.device, &emulated, exact, rows <= kFp8StreamedRows, false, seconds_since(start));
    }
  }
}

void test_fp8_linear(Harness& harness) {
  struct Case {
    int64_t in, out;
    std::vector<int64_t> rows;
    const char* what;
  };
  // On the CUDA backend, rows that are a multiple of 4 with ceil(in / 128) a multiple of 4 take cuBLASLt's
  // block-scaled matmul (CudaBackend::kFp8CublasMinRows), the others above one row the wgmma GEMMs.
  std::vector<Case> cases{{5120, 6144, {1, 2, 3, 8, 16, 64, 300}, "q"},
                          {6144, 5120, {1, 5, 130, 256}, "o"},
                          {2560, 5120, {2, 33, 36}, "down"},
                          {336, 77, {1, 2, 3, 9, 200}, "odd: in not a multiple of 128, out not of 64"},
                          {464, 200, {4, 68, 129}, "ceil(in/128) = 4 with in not a multiple of 128, out not of 128"}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 3);
  Fp8Weights weights(harness);
  for (const Case& c : cases) {
    const Fp8Weight w = weights.make(c.out, c.in, 1.0f / std::sqrt(static_cast<float>(c.in)));
    for (int64_t rows : c.rows) {
      const auto start = std::chrono::steady_clock::now();
      const std::vector<float> x = harness.inputs().uniform(rows * c.in);
      Tensor xd = harness.device().upload_f32(x, {rows, c.in});
      auto y = harness.poisoned(DType::F32, {rows, c.out});
      harness.device().linear(xd, w.device, y.device);
      const bool streamed = rows <= kFp8StreamedRows;
      const std::vector<float> exact = reference_linear(harness, x, rows, w.reference);
      const std::vector<float> emulated = reference_linear(harness, w8a8_activations(x, rows, c.in), rows, w.reference);
      record_fp8(harness, "fp8_linear", fmt::format("T {} {}x{} ({})", rows, c.out, c.in, c.what), y.device, &emulated,
                 exact, streamed, false, seconds_since(start));
    }
  }
  // q|k|v in one op.
  const int64_t in = harness.small_only() ? 272 : 5120;
  std::vector<int64_t> outs = harness.small_only() ? std::vector<int64_t>{77, 5, 130} : std::vector<int64_t>{6144, 1024, 1024};
  std::vector<Fp8Weight> qkv;
  for (int64_t out : outs) qkv.push_back(weights.make(out, in, 1.0f / std::sqrt(static_cast<float>(in))));
  for (int64_t rows : {1L, 2L, 4L, 64L}) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<float> x = harness.inputs().uniform(rows * in);
    Tensor xd = harness.device().upload_f32(x, {rows, in});
    std::vector<Harness::Pair> ys;
    std::vector<const LinearTensors*> list;
    std::vector<Tensor*> outputs;
    for (std::size_t i = 0; i < outs.size(); ++i) ys.push_back(harness.poisoned(DType::F32, {rows, outs[i]}));
    for (std::size_t i = 0; i < outs.size(); ++i) {
      list.push_back(&qkv[i].device);
      outputs.push_back(&ys[i].device);
    }
    harness.device().linear_many(xd, list, outputs);
    const std::vector<float> quantized = w8a8_activations(x, rows, in);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const std::vector<float> exact = reference_linear(harness, x, rows, qkv[i].reference);
      const std::vector<float> emulated = reference_linear(harness, quantized, rows, qkv[i].reference);
      record_fp8(harness, "fp8_linear_many", fmt::format("T {} {}x{}, output {}", rows, outs[i], in, i + 1),
                 ys[i].device, &emulated, exact, rows <= kFp8StreamedRows, false,
                 seconds_since(start));
    }
  }
}

void test_fp8_lm_head(Harness& harness) {
  const int64_t hidden = harness.small_only() ? 336 : 5120, vocab = 4099, tokens = 6;
  Fp8Weights weights(harness);
  const Fp8Weight head = weights.make(vocab, hidden, 1.0f / std::sqrt(static_cast<float>(hidden)));
  auto norm = harness.random_weight(DType::BF16, {hidden}, 1.0f);
  for (const std::vector<int32_t>& selected : {std::vector<int32_t>{5}, std::vector<int32_t>{0, 2, 5}}) {
    const auto start = std::chrono::steady_clock::now();
    const auto count = static_cast<int64_t>(selected.size());
    auto x = harness.f32(harness.inputs().uniform(tokens * hidden, 3.0f), {tokens, hidden});
    auto rows = harness.i32(selected, {count});
    auto logits = harness.poisoned(DType::F32, {count, vocab});
    harness.device().lm_head(x.device, rows.device, norm.device, 1e-6f, head.device, 30.0f, logits.device);
    harness.reference().lm_head(x.reference, rows.reference, norm.reference, 1e-6f, {head.reference, {}, {}}, 30.0f,
                                logits.reference);
    record_fp8(harness, "fp8_lm_head", fmt::format("{} of {} rows, V {} H {}, softcap 30", count, tokens, vocab, hidden),
               logits.device, nullptr, harness.reference().download_f32(logits.reference),
               count <= kFp8StreamedRows, false, seconds_since(start));
  }
}

// The W8A8 SwiGLU as the device computes it, on the host: h and the SwiGLU output each through the quantizer.
std::vector<float> emulated_swiglu(Harness& harness, const std::vector<float>& h, int64_t rows, const Tensor& gate,
                                   const Tensor& up, const Tensor& down) {
  const int64_t inter = gate.dim(0);
  const std::vector<float> hq = w8a8_activations(h, rows, gate.dim(1));
  const std::vector<float> g = reference_linear(harness, hq, rows, gate), u = reference_linear(harness, hq, rows, up);
  std::vector<float> a(g.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = host_silu(g[i]) * u[i];
  return reference_linear(harness, w8a8_activations(a, rows, inter), rows, down);
}

void test_fp8_swiglu(Harness& harness) {
  struct Case {
    int64_t hidden, intermediate;
    std::vector<int64_t> rows;
  };
  std::vector<Case> cases{{5120, 2560, {1, 2, 7, 64}}, {336, 208, {1, 5, 70}}, {512, 384, {3, 12}}};
  if (harness.small_only()) cases.erase(cases.begin());
  Fp8Weights weights(harness);
  for (const Case& c : cases) {
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(c.hidden));
    SwigluTensors device_mlp;
    const Fp8Weight gate = weights.make(c.intermediate, c.hidden, in_scale);
    const Fp8Weight up = weights.make(c.intermediate, c.hidden, in_scale);
    const Fp8Weight down = weights.make(c.hidden, c.intermediate, 1.0f / std::sqrt(static_cast<float>(c.intermediate)));
    device_mlp = {gate.device, up.device, down.device};
    for (int64_t rows : c.rows) {
      const auto start = std::chrono::steady_clock::now();
      const std::vector<float> h = harness.inputs().uniform(rows * c.hidden);
      auto hp = harness.f32(h, {rows, c.hidden});
      auto out = harness.poisoned(DType::F32, {rows, c.hidden});
      harness.device().swiglu(hp.device, device_mlp, out.device);
      harness.reference().swiglu(hp.reference, {{gate.reference, {}, {}}, {up.reference, {}, {}}, {down.reference, {}, {}}},
                                 out.reference);
      const std::vector<float> emulated = emulated_swiglu(harness, h, rows, gate.reference, up.reference, down.reference);
      record_fp8(harness, "fp8_swiglu", fmt::format("T {} H {} I {}", rows, c.hidden, c.intermediate), out.device,
                 &emulated, harness.reference().download_f32(out.reference),
                 rows <= kFp8StreamedRows, true, seconds_since(start));
    }
  }
}

void test_fp8_moe(Harness& harness) {
  struct Case {
    int64_t rows, hidden, intermediate;
    int32_t experts, top_k, distinct;
    const char* what;
    std::vector<int32_t> counts = {};
    float h_scale = 1.0f;  // magnitude of the token rows (the one-token kernels split them into F16 parts)
  };
  std::vector<Case> cases{
      {1, 5120, 2560, 16, 8, 3, "beam widths, one token: streamed"},
      {2, 5120, 2560, 16, 8, 3, "beam widths, two tokens"},
      {64, 5120, 2560, 16, 8, 3, "beam widths"},
      {300, 5120, 2560, 16, 8, 3, "beam widths, prefill (tiles of 128)"},
      {1, 256, 128, 8, 2, 8, "small, one token"},
      {2, 256, 128, 8, 2, 8, "small, two tokens"},
      {33, 256, 128, 8, 2, 8, "small"},
      {70, 336, 208, 12, 3, 12, "odd widths"},
      {60, 336, 208, 64, 2, 16, "tiles of 8, counts 1/7/8/9/16/17/22/40, most idle",
       sparse_counts(64, {{0, 1}, {5, 7}, {9, 8}, {20, 9}, {33, 16}, {40, 17}, {50, 22}, {63, 40}})},
      {600, 256, 128, 10, 2, 10, "tiles of 128, counts 0/1/63/64/65/127/128/129/300/323",
       {0, 1, 63, 64, 65, 127, 128, 129, 300, 323}},
      {1, 336, 208, 12, 3, 12, "odd widths, one token: streamed"},
      {1, 1024, 720, 8, 8, 8, "one token, I a partial 64-wide step and 128 block"},
      {1, 512, 256, 8, 4, 8, "one token, rows of magnitude 3e4", {}, 3e4f},
      {1, 512, 256, 8, 4, 8, "one token, rows of magnitude 1e-6", {}, 1e-6f},
      // The staged kernels' edges (quant/staged_moe.cuh): H 336 is 2.1 down blocks of 160 rows and 10.5 tiles of 32,
      // I 208 two 128-wide stages, the second cut; top 1 combines at the first arrival.
      {1, 336, 208, 8, 1, 8, "one token, top 1"}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 4);
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    Fp8Weights weights(harness);
    std::vector<Fp8Weight> gate, up, down;
    for (int32_t e = 0; e < c.distinct; ++e) {
      const float in_scale = 1.0f / std::sqrt(static_cast<float>(c.hidden));
      gate.push_back(weights.make(c.intermediate, c.hidden, in_scale));
      up.push_back(weights.make(c.intermediate, c.hidden, in_scale));
      down.push_back(weights.make(c.hidden, c.intermediate, 1.0f / std::sqrt(static_cast<float>(c.intermediate))));
    }
    MoeTensors device_moe, reference_moe;
    for (int32_t e = 0; e < c.experts; ++e) {
      const auto i = static_cast<std::size_t>(e % c.distinct);
      device_moe.experts.push_back({gate[i].device, up[i].device, down[i].device});
      reference_moe.experts.push_back(
          {{gate[i].reference, {}, {}}, {up[i].reference, {}, {}}, {down[i].reference, {}, {}}});
    }
    harness.device().prepare_moe(device_moe);
    harness.reference().prepare_moe(reference_moe);
    auto [id_values, weight_values] = random_assignment(harness.inputs(), c.rows, c.experts, c.top_k);
    if (!c.counts.empty()) id_values = assignment_with_counts(harness.inputs(), c.counts, c.rows, c.top_k);
    auto ids = harness.i32(id_values, {c.rows, c.top_k});
    auto routing = harness.f32(weight_values, {c.rows, c.top_k});
    const std::vector<float> h = harness.inputs().uniform(c.rows * c.hidden, c.h_scale);
    auto hp = harness.f32(h, {c.rows, c.hidden});
    auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
    harness.device().moe(hp.device, ids.device, routing.device, device_moe, out.device);
    harness.reference().moe(hp.reference, ids.reference, routing.reference, reference_moe, out.reference);
    // The W8A8 emulation per slot, summed in j order (small widths only: host loops).
    std::vector<float> emulated;
    const bool emulate = c.hidden * c.intermediate <= 336 * 208;
    if (emulate) {
      emulated.assign(static_cast<std::size_t>(c.rows * c.hidden), 0.0f);
      for (int64_t t = 0; t < c.rows; ++t)
        for (int32_t j = 0; j < c.top_k; ++j) {
          const auto slot = static_cast<std::size_t>(t * c.top_k + j);
          const auto e = static_cast<std::size_t>(id_values[slot] % c.distinct);
          const std::vector<float> row(h.begin() + t * c.hidden, h.begin() + (t + 1) * c.hidden);
          const std::vector<float> y =
              emulated_swiglu(harness, row, 1, gate[e].reference, up[e].reference, down[e].reference);
          for (int64_t i = 0; i < c.hidden; ++i) emulated[static_cast<std::size_t>(t * c.hidden + i)] += weight_values[slot] * y[static_cast<std::size_t>(i)];
        }
    }
    record_fp8(harness, "fp8_moe",
               fmt::format("T {} H {} I {} E {} top {} ({})", c.rows, c.hidden, c.intermediate, c.experts, c.top_k,
                           c.what),
               out.device, emulate ? &emulated : nullptr, harness.reference().download_f32(out.reference), c.rows == 1,
               true, seconds_since(start));
  }
}

}  // namespace

void test_fp8(Harness& harness) {
  test_fp8_quantize(harness);
  test_fp8_linear(harness);
  test_fp8_shard_parts(harness);
  test_fp8_lm_head(harness);
  test_fp8_swiglu(harness);
  test_fp8_moe(harness);
}


// ---- perf ----

namespace {

struct PerfOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> tokens{1, 16, 64, 256, 1024, 8192};
  std::vector<int64_t> rows{1, 2, 4, 8, 64, 1024};
  int64_t iterations = 20;
  uint64_t seed = 1;
  bool moe = true, linear = true;
};

#ifdef BEAMLINE_HAVE_CUDA

int64_t blocks128(int64_t n) { return (n + 127) / 128; }

// Codes e4m3(normal(0, 64)) and one scale per block, so that the weights are about normal(0, stddev).
LinearTensors fp8_weight(CudaBackend& backend, int64_t out, int64_t in, uint64_t& seed, float stddev) {
  LinearTensors w;
  w.weight = backend.random_weight(DType::F8_E4M3, {out, in}, seed++, 0.0f, 64.0f);
  w.scale = backend.random_weight(DType::F32, {blocks128(out), blocks128(in)}, seed++, stddev / 64.0f, 0.0f);
  return w;
}

double fp8_bytes(int64_t out, int64_t in) {
  return static_cast<double>(out * in) + 4.0 * static_cast<double>(blocks128(out) * blocks128(in));
}

void bench_moe(CudaBackend& backend, const ModelConfig& config, uint64_t& seed, const PerfOptions& options) {
  const int64_t hidden = config.hidden_size, inter = config.moe_intermediate_size, experts = config.n_routed_experts;
  MoeTensors moe;
  // Near-zero router logits and no bias: close to uniform routing, as in PERF.md's floors.
  moe.router = backend.random_weight(DType::F32, {experts, hidden}, seed++, 0.0f, 1e-3f);
  moe.router_bias = backend.random_weight(DType::F32, {experts}, seed++, 0.0f, 0.0f);
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  const float down_scale = 1.0f / std::sqrt(static_cast<float>(inter));
  for (int64_t e = 0; e < experts; ++e)
    moe.experts.push_back({fp8_weight(backend, inter, hidden, seed, in_scale),
                           fp8_weight(backend, inter, hidden, seed, in_scale),
                           fp8_weight(backend, hidden, inter, seed, down_scale)});
  backend.prepare_moe(moe);
  const RouterParams router = router_params(config);
  std::printf("\n| tokens | experts hit | FP8 MoE ms (route + experts, graph) | route ms | floor ms (bytes) | "
              "floor ms (FLOPs) | floor / time | TB/s | TFLOP/s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const int64_t tokens : options.tokens) {
    const Tensor h = backend.random_weight(DType::F32, {tokens, hidden}, seed++, 0.0f, 1.0f);
    Tensor ids = backend.alloc(DType::I32, {tokens, router.top_k}), weights = backend.alloc(DType::F32, {tokens, router.top_k});
    Tensor out = backend.alloc(DType::F32, {tokens, hidden});
    auto layer = [&] {
      backend.route(h, moe.router, moe.router_bias, router, ids, weights);
      backend.moe(h, ids, weights, moe, out);
    };
    const double ms = time_graph(backend, layer, options.iterations, "fp8");
    const double route_ms = time_graph(
        backend, [&] { backend.route(h, moe.router, moe.router_bias, router, ids, weights); }, options.iterations, "fp8");
    const std::vector<int32_t> routed = backend.download_i32(ids);
    const std::set<int32_t> hit(routed.begin(), routed.end());
    const double bytes = 4.0 * static_cast<double>(experts * hidden) +
                         static_cast<double>(hit.size()) * (2.0 * fp8_bytes(inter, hidden) + fp8_bytes(hidden, inter));
    const double flops = 2.0 * 3.0 * static_cast<double>(hidden * inter) * static_cast<double>(tokens * router.top_k);
    const double bytes_ms = bytes / kHbmBytesPerSecond * 1e3, flops_ms = flops / kFp8FlopsPerSecond * 1e3;
    std::printf("| %lld | %zu | %.4f | %.4f | %.4f | %.4f | %.2f | %.2f | %.0f |\n", static_cast<long long>(tokens),
                hit.size(), ms, route_ms, bytes_ms, flops_ms, std::max(bytes_ms, flops_ms) / ms,
                bytes / (ms * 1e-3) / 1e12, flops / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
  }
}

void bench_linear(CudaBackend& backend, const ModelConfig& config, uint64_t& seed, const PerfOptions& options) {
  const int64_t hidden = config.hidden_size, q_width = config.num_attention_heads * config.head_dim,
                kv_width = config.num_key_value_heads * config.head_dim, inter = config.intermediate_size,
                vocab = config.vocab_size;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  // Copies so that one replay reads at least 256 MB of weights: L2 (60 MB) holds none between reads.
  auto copies_for = [](double bytes) { return static_cast<int>(std::max(1.0, std::ceil(256e6 / bytes))); };
  struct Attention {
    LinearTensors q, k, v, o;
  };
  const double qkv_bytes = fp8_bytes(q_width, hidden) + 2.0 * fp8_bytes(kv_width, hidden);
  const double o_bytes = fp8_bytes(hidden, q_width);
  const double mlp_bytes = 2.0 * fp8_bytes(inter, hidden) + fp8_bytes(hidden, inter);
  const double head_bytes = fp8_bytes(vocab, hidden);
  std::vector<Attention> attention(static_cast<std::size_t>(copies_for(o_bytes)));
  for (Attention& a : attention) {
    a.q = fp8_weight(backend, q_width, hidden, seed, in_scale);
    a.k = fp8_weight(backend, kv_width, hidden, seed, in_scale);
    a.v = fp8_weight(backend, kv_width, hidden, seed, in_scale);
    a.o = fp8_weight(backend, hidden, q_width, seed, in_scale);
  }
  std::vector<SwigluTensors> mlp(static_cast<std::size_t>(copies_for(mlp_bytes)));
  for (SwigluTensors& m : mlp)
    m = {fp8_weight(backend, inter, hidden, seed, in_scale), fp8_weight(backend, inter, hidden, seed, in_scale),
         fp8_weight(backend, hidden, inter, seed, 1.0f / std::sqrt(static_cast<float>(inter)))};
  const LinearTensors head = fp8_weight(backend, vocab, hidden, seed, 4.0f * in_scale);
  const Tensor norm = backend.random_weight(DType::BF16, {hidden}, seed++, 0.0f, 1.0f);
  std::printf("\n| op | weights | rows | floor ms | beamline ms (path) | floor / time | TB/s | TFLOP/s | wgmma ms where "
              "another path ran |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const int64_t rows : options.rows) {
    const Tensor h = backend.random_weight(DType::F32, {rows, hidden}, seed++, 0.0f, 1.0f);
    const Tensor attended = backend.random_weight(DType::F32, {rows, q_width}, seed++, 0.0f, 1.0f);
    Tensor q = backend.alloc(DType::F32, {rows, q_width}), k = backend.alloc(DType::F32, {rows, kv_width}),
           v = backend.alloc(DType::F32, {rows, kv_width}), out = backend.alloc(DType::F32, {rows, hidden});
    const int64_t head_rows = std::min<int64_t>(rows, 64);  // the LM head sees sampled rows only
    std::vector<int32_t> picked(static_cast<std::size_t>(head_rows));
    for (int64_t i = 0; i < head_rows; ++i) picked[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    const Tensor logit_rows = backend.upload_i32(picked, {head_rows});
    Tensor logits = backend.alloc(DType::F32, {head_rows, vocab});
    struct Op {
      const char* name;
      double bytes, flops;
      int64_t rows;
      std::function<void()> run;
    };
    const int qkv_copies = std::min<int>(copies_for(qkv_bytes), static_cast<int>(attention.size()));
    std::vector<Op> ops{
        {"q, k, v (linear_many)", qkv_bytes, 2.0 * static_cast<double>(rows * hidden * (q_width + 2 * kv_width)), rows,
         [&] {
           for (int c = 0; c < qkv_copies; ++c) {
             const Attention& a = attention[static_cast<std::size_t>(c)];
             const std::array<const LinearTensors*, 3> weights{&a.q, &a.k, &a.v};
             const std::array<Tensor*, 3> ys{&q, &k, &v};
             backend.linear_many(h, weights, ys);
           }
         }},
        {"o", o_bytes, 2.0 * static_cast<double>(rows * hidden * q_width), rows,
         [&] {
           for (const Attention& a : attention) backend.linear(attended, a.o, out);
         }},
        {"dense SwiGLU MLP", mlp_bytes, 6.0 * static_cast<double>(rows * hidden * inter), rows,
         [&] {
           for (const SwigluTensors& m : mlp) backend.swiglu(h, m, out);
         }},
        {"LM head (norm + soft cap)", head_bytes, 2.0 * static_cast<double>(head_rows * hidden * vocab), head_rows,
         [&] { backend.lm_head(h, logit_rows, norm, 1e-6f, head, 30.0f, logits); }}};
    const int copies[] = {qkv_copies, static_cast<int>(attention.size()), static_cast<int>(mlp.size()), 1};
    // The first projection's shape of each op decides its W8A8 path label (the others share in and rows).
    const int64_t first_out[] = {q_width, hidden, inter, vocab}, first_in[] = {hidden, q_width, hidden, hidden};
    const int64_t cublas_rows = backend.fp8_cublas_min_rows();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (i == 3 && rows > 64) continue;
      backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
      const double ms = time_graph(backend, op.run, options.iterations, "fp8") / copies[i];
      const bool streamed = op.rows <= CudaBackend::kFp8StreamingMaxRows;
      const bool cublas = !streamed && i != 3 && backend.fp8_cublas_path(op.rows, first_in[i], first_out[i]);
      double wgmma_ms = 0.0;
      if (streamed || cublas) {
        backend.set_streaming_max_rows(0);
        backend.set_fp8_cublas_min_rows(std::numeric_limits<int64_t>::max());
        wgmma_ms = time_graph(backend, op.run, options.iterations, "fp8") / copies[i];
        backend.set_streaming_max_rows(CudaBackend::kStreamingMaxRows);
        backend.set_fp8_cublas_min_rows(cublas_rows);
      }
      const double floor_ms = std::max(op.bytes / kHbmBytesPerSecond, op.flops / kFp8FlopsPerSecond) * 1e3;
      std::printf("| %s | %.0f MB | %lld | %.4f | %.4f (%s) | %.2f | %.2f | %.0f | %s |\n", op.name, op.bytes / 1e6,
                  static_cast<long long>(op.rows), floor_ms, ms,
                  streamed ? "W8A16 streamed" : cublas ? "W8A8 cuBLASLt" : "W8A8 wgmma", floor_ms / ms,
                  op.bytes / (ms * 1e-3) / 1e12, op.flops / (ms * 1e-3) / 1e12,
                  streamed || cublas ? fmt::format("{:.4f}", wgmma_ms).c_str() : "—");
      std::fflush(stdout);
    }
  }
}

void run_perf(const PerfOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(options.iterations >= 1, "perf fp8: --iterations must be >= 1");
  CudaBackend backend;
  uint64_t seed = options.seed;
  spdlog::info("perf fp8: {} on {}", options.preset, backend.device_description());
  if (options.linear) bench_linear(backend, config, seed, options);
  if (options.moe && config.n_routed_experts > 0) bench_moe(backend, config, seed, options);
}
#endif

}  // namespace

void add_fp8_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "fp8", "Time FP8 block-128 weights on the GPU (one MoE layer per token count; the dense projections per "
                   "row count) with random on-device codes, as CUDA graphs, next to the bytes and FLOP floors");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--tokens", options->tokens, "MoE token counts")->delimiter(',')->capture_default_str();
  command->add_option("--rows", options->rows, "projection row counts")->delimiter(',')->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->add_flag("!--no-moe", options->moe, "skip the MoE table");
  command->add_flag("!--no-linear", options->linear, "skip the projections table");
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("fp8");
#endif
  });
}

}  // namespace beamline::backend_ops

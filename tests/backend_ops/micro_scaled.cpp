// MXFP8 and NVFP4 weights (MODEL_FORMAT.md section 5; the CUDA paths of backend/cuda/quant/micro.h) in both modes.
// Test (groups mxfp8 and nvfp4): linear, linear_many, lm_head, swiglu and moe with the same quantized weights on both
// backends; the CPU backend computes with their exact dequantization (quant/quantize.h), so the reference is exact.
// The activations stay F32 on the device (weight-only), so:
//  - one streamed row (every op at 1 row, the MoE at any token count: it streams token by token) sums the same
//    products in another order: FP32's tolerance (kF32Tolerance);
//  - more rows decode the weights exactly to BF16 and take the BF16 GEMMs, whose operand precision is the --dtype
//    under test (Harness::operand_tolerance: 2e-4 for float32's split operands, 1e-2 for bfloat16).
// Shapes: Beam-1.0's widths, and odd ones: in not a multiple of 128 (MXFP8 352 = 11 x 32) or of 32 (NVFP4 336 =
// 21 x 16: the 8-byte path), out not a multiple of the 4 rows a warp streams.
// Perf (`perf micro`): one MoE layer of the preset per format (route + experts as one CUDA graph, and the experts
// alone), random codes drawn on the device, next to the floor of the bytes each format reads (codes, scales, scale_2,
// the F32 router) at 4.8 TB/s.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/common/kernel_variant.h"
#include "checkpoint/presets.h"
#include "harness.h"
#include "model/beam_model.h"
#include "op_families.h"
#include "perf.h"
#include "quant/quantize.h"
#include "shard_parts.h"
#include "util/error.h"

namespace beamline::backend_ops {
namespace {

// The weights of one case on both backends, quantized on the host; the bytes stay alive here (the CPU borrows them).
class QuantizedWeights {
 public:
  QuantizedWeights(Harness& harness, QuantScheme scheme) : harness_(harness), scheme_(scheme) {}

  struct Pair {
    LinearTensors device, reference;
  };
  Pair make(int64_t out, int64_t in, float scale) {
    const std::vector<float> values = harness_.inputs().uniform(out * in, scale);
    return upload(quantized_.emplace_back(quantize_weight(scheme_, values, out, in)).view());
  }

  // One rank's part of a whole [out, in] weight, cut as checkpoint/shard_weights.cpp cuts it (quant/slice.h).
  Pair make_part(int64_t out, int64_t in, SliceAxis axis, int64_t begin, int64_t count, float scale) {
    const std::vector<float> values = harness_.inputs().uniform(out * in, scale);
    const QuantizedWeight& whole = quantized_.emplace_back(quantize_weight(scheme_, values, out, in));
    if (axis == SliceAxis::Rows) return upload(quantized_rows(whole.view(), begin, count));
    return upload(quantized_.emplace_back(quantized_columns(whole.view(), begin, count)).view());
  }

 private:
  // `q`'s bytes (alive in quantized_) on both backends, shaped by the layout of its own [out, in].
  Pair upload(const QuantizedWeightView& q) {
    const int64_t out = q.out_features, in = q.in_features;
    const QuantLayout layout = quant_layout(scheme_, out, in);
    const std::size_t code_bytes = static_cast<std::size_t>(layout.weight_shape[0] * layout.weight_shape[1]);
    const std::size_t scale_bytes =
        static_cast<std::size_t>(layout.scale_shape[0] * layout.scale_shape[1]) * dtype_size(layout.scale_dtype);
    const DType scale_dtype = scheme_ == QuantScheme::Mxfp8 ? DType::F8_E8M0 : layout.scale_dtype;
    auto view = [&](std::string_view what, DType dtype, std::vector<int64_t> shape, const void* data,
                    std::size_t bytes) {
      TensorView v;
      v.name = fmt::format("{} {} {}", quant_scheme_name(scheme_), what, shape_string(shape));
      v.dtype = dtype;
      v.shape = std::move(shape);
      v.data = static_cast<const std::byte*>(data);
      v.nbytes = bytes;
      return v;
    };
    const Harness::Pair codes =
        harness_.weight(view("codes", layout.weight_dtype, layout.weight_shape, q.codes, code_bytes));
    const Harness::Pair scales =
        harness_.weight(view("scales", scale_dtype, layout.scale_shape, q.scales, scale_bytes));
    Pair pair{{codes.device, scales.device, {}}, {codes.reference, scales.reference, {}}};
    if (layout.has_scale_2) {
      const Harness::Pair scale_2 =
          harness_.weight(view("scale_2", DType::F32, {}, &scales_2_.emplace_back(q.scale_2), sizeof(float)));
      pair.device.scale_2 = scale_2.device;
      pair.reference.scale_2 = scale_2.reference;
    }
    return pair;
  }

  Harness& harness_;
  QuantScheme scheme_;
  std::deque<QuantizedWeight> quantized_;
  std::deque<float> scales_2_;
};

// Rows that the CUDA backend streams (CudaBackend::kMicroStreamingMaxRows; a MoE streams at any token count).
constexpr int64_t kStreamedRows = 1;

// The tolerance of `rows` rows through a projection: exact products while streamed, the BF16 GEMMs' beyond.
double projection_tolerance(const Harness& harness, int64_t rows) {
  return rows <= kStreamedRows ? kF32Tolerance : harness.operand_tolerance();
}

const char* path_of(int64_t rows) { return rows <= kStreamedRows ? "streamed" : "BF16 decode + GEMM"; }

struct Widths {
  int64_t odd_in;     // not a multiple of 128 (MXFP8) or of 32 (NVFP4)
  int64_t odd_inter;  // an odd intermediate width of the same kind
};
Widths odd_widths(QuantScheme scheme) { return scheme == QuantScheme::Mxfp8 ? Widths{352, 224} : Widths{336, 208}; }

void test_linear_ops(Harness& harness, QuantScheme scheme, const std::string& name) {
  struct Case {
    int64_t in, out;
    std::vector<int64_t> rows;
    const char* what;
  };
  const Widths odd = odd_widths(scheme);
  std::vector<Case> cases{{5120, 6144, {1, 2, 5}, "q"},
                          {6144, 5120, {1, 3}, "o"},
                          {2560, 5120, {1, 2}, "down"},
                          {odd.odd_in, 77, {1, 2, 9}, "odd: in cut, out not a multiple of 4"},
                          {32, 5, {1, 3}, "tiny"}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 3);
  QuantizedWeights weights(harness, scheme);
  for (const Case& c : cases) {
    const auto w = weights.make(c.out, c.in, 1.0f / std::sqrt(static_cast<float>(c.in)));
    for (int64_t rows : c.rows) {
      const auto start = std::chrono::steady_clock::now();
      auto x = harness.f32(harness.inputs().uniform(rows * c.in), {rows, c.in});
      auto y = harness.poisoned(DType::F32, {rows, c.out});
      harness.device().linear(x.device, w.device, y.device);
      harness.reference().linear(x.reference, w.reference, y.reference);
      harness.record(name + "_linear", fmt::format("T {} {}x{} ({}; {})", rows, c.out, c.in, c.what, path_of(rows)), y,
                     projection_tolerance(harness, rows), seconds_since(start));
    }
  }
  // q|k|v in one op (one streaming launch for up to four weights).
  const int64_t in = harness.small_only() ? odd.odd_in : 5120;
  const std::vector<int64_t> outs =
      harness.small_only() ? std::vector<int64_t>{77, 5, 130} : std::vector<int64_t>{6144, 1024, 1024};
  std::vector<QuantizedWeights::Pair> qkv;
  for (int64_t out : outs) qkv.push_back(weights.make(out, in, 1.0f / std::sqrt(static_cast<float>(in))));
  for (int64_t rows : {1L, 3L}) {
    const auto start = std::chrono::steady_clock::now();
    auto x = harness.f32(harness.inputs().uniform(rows * in), {rows, in});
    std::vector<Harness::Pair> ys;
    for (int64_t out : outs) ys.push_back(harness.poisoned(DType::F32, {rows, out}));
    std::vector<const LinearTensors*> device_list, reference_list;
    std::vector<Tensor*> device_out, reference_out;
    for (std::size_t i = 0; i < outs.size(); ++i) {
      device_list.push_back(&qkv[i].device);
      reference_list.push_back(&qkv[i].reference);
      device_out.push_back(&ys[i].device);
      reference_out.push_back(&ys[i].reference);
    }
    harness.device().linear_many(x.device, device_list, device_out);
    harness.reference().linear_many(x.reference, reference_list, reference_out);
    for (std::size_t i = 0; i < outs.size(); ++i)
      harness.record(name + "_linear_many",
                     fmt::format("T {} {}x{}, output {} ({})", rows, outs[i], in, i + 1, path_of(rows)), ys[i],
                     projection_tolerance(harness, rows), seconds_since(start));
  }
  // LM head: the norm, the selected rows and the soft cap.
  const int64_t hidden = harness.small_only() ? odd.odd_in : 5120, vocab = 4099, tokens = 6;
  const auto head = weights.make(vocab, hidden, 1.0f / std::sqrt(static_cast<float>(hidden)));
  auto norm = harness.random_weight(DType::BF16, {hidden}, 1.0f);
  for (const std::vector<int32_t>& selected : {std::vector<int32_t>{5}, std::vector<int32_t>{0, 2, 5}}) {
    const auto start = std::chrono::steady_clock::now();
    const auto count = static_cast<int64_t>(selected.size());
    auto x = harness.f32(harness.inputs().uniform(tokens * hidden, 3.0f), {tokens, hidden});
    auto rows = harness.i32(selected, {count});
    auto logits = harness.poisoned(DType::F32, {count, vocab});
    harness.device().lm_head(x.device, rows.device, norm.device, 1e-6f, head.device, 30.0f, logits.device);
    harness.reference().lm_head(x.reference, rows.reference, norm.reference, 1e-6f, head.reference, 30.0f,
                                logits.reference);
    harness.record(name + "_lm_head",
                   fmt::format("{} of {} rows, V {} H {}, softcap 30 ({})", count, tokens, vocab, hidden, path_of(count)),
                   logits, projection_tolerance(harness, count), seconds_since(start));
  }
}

// The CUDA backend's path for these widths (micro.h moe_tokens; scales are 4-byte aligned in the harness): staged
// through shared memory (MXFP8 widths multiples of 128, NVFP4 of 64) unless BEAMLINE_CUDA_TOKEN_MOE names a register
// version, else one token on the tensor cores from registers (NVFP4: multiples of 32, not `legacy`), else streamed
// token by token.
std::string cuda_moe_path(QuantScheme scheme, int64_t rows, int64_t hidden, int64_t intermediate) {
  const std::string_view version = cuda::kernel_variant("BEAMLINE_CUDA_TOKEN_MOE");
  const bool mxfp8 = scheme == QuantScheme::Mxfp8;
  const int64_t staged_unit = mxfp8 ? 128 : 64;
  if (version != "legacy" && version != "ring" && hidden % staged_unit == 0 && intermediate % staged_unit == 0)
    return "staged";
  if (rows == 1 && (mxfp8 || (version != "legacy" && hidden % 32 == 0 && intermediate % 32 == 0)))
    return "tensor cores";
  return "streamed per token";
}

void test_swiglu_moe(Harness& harness, QuantScheme scheme, const std::string& name) {
  const Widths odd = odd_widths(scheme);
  struct SwigluCase {
    int64_t hidden, intermediate;
    std::vector<int64_t> rows;
  };
  std::vector<SwigluCase> swiglu_cases{{5120, 2560, {1, 3}}, {odd.odd_in, odd.odd_inter, {1, 4}}};
  if (harness.small_only()) swiglu_cases.erase(swiglu_cases.begin());
  QuantizedWeights weights(harness, scheme);
  for (const SwigluCase& c : swiglu_cases) {
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(c.hidden));
    const auto gate = weights.make(c.intermediate, c.hidden, in_scale);
    const auto up = weights.make(c.intermediate, c.hidden, in_scale);
    const auto down = weights.make(c.hidden, c.intermediate, 1.0f / std::sqrt(static_cast<float>(c.intermediate)));
    for (int64_t rows : c.rows) {
      const auto start = std::chrono::steady_clock::now();
      auto h = harness.f32(harness.inputs().uniform(rows * c.hidden), {rows, c.hidden});
      auto out = harness.poisoned(DType::F32, {rows, c.hidden});
      harness.device().swiglu(h.device, {gate.device, up.device, down.device}, out.device);
      harness.reference().swiglu(h.reference, {gate.reference, up.reference, down.reference}, out.reference);
      harness.record(name + "_swiglu", fmt::format("T {} H {} I {} ({})", rows, c.hidden, c.intermediate, path_of(rows)),
                     out, projection_tolerance(harness, rows), seconds_since(start));
    }
  }
  struct MoeCase {
    int64_t rows, hidden, intermediate;
    int32_t experts, top_k, distinct;
    const char* what;
  };
  std::vector<MoeCase> moe_cases{{1, 5120, 2560, 16, 8, 2, "beam widths, one token"},
                                 {3, 5120, 2560, 16, 8, 2, "beam widths, three tokens"},
                                 {1, 256, 128, 8, 2, 8, "small, one token"},
                                 {7, odd.odd_in, odd.odd_inter, 12, 3, 12, "odd widths"},
                                 {1, odd.odd_in, odd.odd_inter, 12, 3, 12, "odd widths, one token"},
                                 {1, 1024, 704, 8, 8, 8, "one token, eight distinct experts"},
                                 // MXFP8's ring of two 4-step halves: 12 and 20 scale groups (packed scale words,
                                 // the last batch one half), 11 and 7 above (byte scales, a partial half).
                                 {1, 384, 640, 8, 8, 8, "one token, a batch's last half"},
                                 // The staged kernels (quant/staged_moe.cuh): H 896 is 5.6 down blocks of 160 rows
                                 // (a last combine unit cut) and 3.5 NVFP4 stages of 256; top 1 and top 3 combine
                                 // as soon as one or three blocks arrive.
                                 {1, 896, 384, 8, 3, 8, "one token: rows and stages cut"},
                                 {1, 256, 128, 8, 1, 8, "one token, top 1"},
                                 // More tokens on the staged kernels: one call of 5 tokens (grid z), and 70 tokens
                                 // in calls of 64 and 6.
                                 {5, 384, 640, 8, 8, 8, "five tokens"},
                                 {70, 256, 128, 8, 2, 8, "70 tokens: calls of 64 and 6"}};
  if (harness.small_only()) moe_cases.erase(moe_cases.begin(), moe_cases.begin() + 2);
  for (const MoeCase& c : moe_cases) {
    const auto start = std::chrono::steady_clock::now();
    QuantizedWeights expert_weights(harness, scheme);
    std::vector<QuantizedWeights::Pair> gate, up, down;
    for (int32_t e = 0; e < c.distinct; ++e) {
      const float in_scale = 1.0f / std::sqrt(static_cast<float>(c.hidden));
      gate.push_back(expert_weights.make(c.intermediate, c.hidden, in_scale));
      up.push_back(expert_weights.make(c.intermediate, c.hidden, in_scale));
      down.push_back(expert_weights.make(c.hidden, c.intermediate, 1.0f / std::sqrt(static_cast<float>(c.intermediate))));
    }
    MoeTensors device_moe, reference_moe;
    for (int32_t e = 0; e < c.experts; ++e) {
      const auto i = static_cast<std::size_t>(e % c.distinct);
      device_moe.experts.push_back({gate[i].device, up[i].device, down[i].device});
      reference_moe.experts.push_back({gate[i].reference, up[i].reference, down[i].reference});
    }
    harness.device().prepare_moe(device_moe);
    harness.reference().prepare_moe(reference_moe);
    const auto [id_values, weight_values] = random_assignment(harness.inputs(), c.rows, c.experts, c.top_k);
    auto ids = harness.i32(id_values, {c.rows, c.top_k});
    auto routing = harness.f32(weight_values, {c.rows, c.top_k});
    auto h = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
    auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
    harness.device().moe(h.device, ids.device, routing.device, device_moe, out.device);
    harness.reference().moe(h.reference, ids.reference, routing.reference, reference_moe, out.reference);
    harness.record(name + "_moe",
                   fmt::format("T {} H {} I {} E {} top {} ({}; {})", c.rows, c.hidden, c.intermediate, c.experts,
                               c.top_k, c.what, cuda_moe_path(scheme, c.rows, c.hidden, c.intermediate)),
                   out, kF32Tolerance, seconds_since(start));
  }
}

// A scale of the wrong shape is refused, naming the op and the tensor (the device checks the layout again).
void test_refusal(Harness& harness, QuantScheme scheme, const std::string& name) {
  QuantizedWeights weights(harness, scheme);
  const int64_t in = odd_widths(scheme).odd_in;
  auto w = weights.make(8, in, 0.1f);
  w.device.scale = harness.device().upload_f32(std::vector<float>(8, 1.0f), {8, 1});  // wrong dtype and shape
  auto x = harness.f32(harness.inputs().uniform(in), {1, in});
  auto y = harness.poisoned(DType::F32, {1, 8});
  std::string message;
  try {
    harness.device().linear(x.device, w.device, y.device);
  } catch (const Error& error) {
    message = error.what();
  }
  const bool named = message.find("linear") != std::string::npos && message.find("scale") != std::string::npos;
  harness.record_result({name + "_refusal", "linear with an F32 [8, 1] scale", named ? 0.0 : 1.0, 0.0,
                         message.empty() ? "not refused" : message, named, 0.0});
}

// One tensor-parallel rank's parts (shard_parts.h): codes and scales cut from a whole weight by quant/slice.h, uploaded
// with the layout of the part's own shape, as a sharded model loads them; exact against the CPU's dequantization.
void test_shard_parts(Harness& harness, QuantScheme scheme, const std::string& name) {
  QuantizedWeights weights(harness, scheme);
  for (const ShardPartCase& c : shard_part_cases(scheme, harness.small_only())) {
    const auto w = weights.make_part(c.out, c.in, c.axis, c.begin, c.count, 1.0f / std::sqrt(static_cast<float>(c.in)));
    const int64_t out = c.part_out(), in = c.part_in();
    for (int64_t rows : {1L, 3L}) {
      const auto start = std::chrono::steady_clock::now();
      auto x = harness.f32(harness.inputs().uniform(rows * in), {rows, in});
      auto y = harness.poisoned(DType::F32, {rows, out});
      harness.device().linear(x.device, w.device, y.device);
      harness.reference().linear(x.reference, w.reference, y.reference);
      harness.record(name + "_shard_linear",
                     fmt::format("T {} {} [{}, {}) of {}x{} ({})", rows, c.axis == SliceAxis::Rows ? "rows" : "columns",
                                 c.begin, c.begin + c.count, c.out, c.in, c.what),
                     y, projection_tolerance(harness, rows), seconds_since(start));
    }
  }
}

void test_scheme(Harness& harness, QuantScheme scheme) {
  const std::string name(quant_scheme_name(scheme));
  test_linear_ops(harness, scheme, name);
  test_shard_parts(harness, scheme, name);
  test_swiglu_moe(harness, scheme, name);
  test_refusal(harness, scheme, name);
}

}  // namespace

void test_mxfp8(Harness& harness) { test_scheme(harness, QuantScheme::Mxfp8); }
void test_nvfp4(Harness& harness) { test_scheme(harness, QuantScheme::Nvfp4); }

// ---- perf ----

namespace {

struct PerfOptions {
  std::string preset = "beam-1.0";
  std::vector<std::string> formats{"mxfp8", "nvfp4"};
  std::vector<int64_t> tokens{1, 2, 16};
  int64_t iterations = 20;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA

// Random codes and constant scales drawn on the device: the codes are E4M3 codes of normal(0, 64) (for NVFP4 their
// bytes read as pairs of E2M1 codes), the MXFP8 scales 2^-7 (E8M0 120, drawn as the E4M3 of 256 = code 0x78), the
// NVFP4 scales E4M3 `stddev`-like and scale_2 1/6. The tensors that hold the bytes live in `keep`; the weight's
// tensors borrow them with the format's dtypes.
LinearTensors random_micro_weight(CudaBackend& backend, QuantScheme scheme, int64_t out, int64_t in, uint64_t& seed,
                                  float stddev, std::deque<Tensor>& keep) {
  const QuantLayout layout = quant_layout(scheme, out, in);
  auto borrow = [&](const Tensor& bytes, DType dtype, std::vector<int64_t> shape) {
    keep.push_back(bytes);
    return Tensor(Device::Cuda, dtype, std::move(shape), bytes.raw(), nullptr);
  };
  LinearTensors w;
  const Tensor codes = backend.random_weight(DType::F8_E4M3, layout.weight_shape, seed++, 0.0f, 64.0f);
  w.weight = borrow(codes, layout.weight_dtype, layout.weight_shape);
  if (scheme == QuantScheme::Mxfp8) {
    const Tensor scales = backend.random_weight(DType::F8_E4M3, layout.scale_shape, seed++, 256.0f, 0.0f);
    w.scale = borrow(scales, DType::F8_E8M0, layout.scale_shape);
  } else {
    w.scale = backend.random_weight(DType::F8_E4M3, layout.scale_shape, seed++, stddev * 6.0f, 0.0f);
    const std::vector<float> scale_2{1.0f / 6.0f};
    w.scale_2 = backend.upload_f32(scale_2, {1});
  }
  return w;
}

double weight_bytes(QuantScheme scheme, int64_t out, int64_t in) {
  const double elements = static_cast<double>(out * in);
  return scheme == QuantScheme::Mxfp8 ? elements + elements / 32.0 : elements / 2.0 + elements / 16.0 + 4.0;
}

void bench_moe(CudaBackend& backend, const ModelConfig& config, QuantScheme scheme, uint64_t& seed,
               const PerfOptions& options) {
  const int64_t hidden = config.hidden_size, inter = config.moe_intermediate_size, experts = config.n_routed_experts;
  std::deque<Tensor> keep;
  MoeTensors moe;
  moe.router = backend.random_weight(DType::F32, {experts, hidden}, seed++, 0.0f, 1e-3f);
  moe.router_bias = backend.random_weight(DType::F32, {experts}, seed++, 0.0f, 0.0f);
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  const float down_scale = 1.0f / std::sqrt(static_cast<float>(inter));
  for (int64_t e = 0; e < experts; ++e)
    moe.experts.push_back({random_micro_weight(backend, scheme, inter, hidden, seed, in_scale, keep),
                           random_micro_weight(backend, scheme, inter, hidden, seed, in_scale, keep),
                           random_micro_weight(backend, scheme, hidden, inter, seed, down_scale, keep)});
  backend.prepare_moe(moe);
  const RouterParams router = router_params(config);
  const double expert_bytes = 2.0 * weight_bytes(scheme, inter, hidden) + weight_bytes(scheme, hidden, inter);
  for (const int64_t tokens : options.tokens) {
    const Tensor h = backend.random_weight(DType::F32, {tokens, hidden}, seed++, 0.0f, 1.0f);
    Tensor ids = backend.alloc(DType::I32, {tokens, router.top_k});
    Tensor weights = backend.alloc(DType::F32, {tokens, router.top_k});
    Tensor out = backend.alloc(DType::F32, {tokens, hidden});
    auto route = [&] { backend.route(h, moe.router, moe.router_bias, router, ids, weights); };
    const double ms = time_graph(
        backend, [&] { route(); backend.moe(h, ids, weights, moe, out); }, options.iterations, "micro");
    const double route_ms = time_graph(backend, route, options.iterations, "micro");
    const double experts_ms =
        time_graph(backend, [&] { backend.moe(h, ids, weights, moe, out); }, options.iterations, "micro");
    const std::vector<int32_t> routed = backend.download_i32(ids);
    const std::set<int32_t> hit(routed.begin(), routed.end());
    const double bytes = 4.0 * static_cast<double>(experts * hidden) + static_cast<double>(hit.size()) * expert_bytes;
    const double floor_ms = bytes / kHbmBytesPerSecond * 1e3;
    const double experts_floor_ms = static_cast<double>(hit.size()) * expert_bytes / kHbmBytesPerSecond * 1e3;
    std::printf("| %s | %lld | %zu | %.4f | %.4f | %.2f | %.4f | %.4f | %.2f | %.4f | %.2f |\n",
                std::string(quant_scheme_name(scheme)).c_str(), static_cast<long long>(tokens), hit.size(), floor_ms,
                ms, ms / floor_ms, experts_floor_ms, experts_ms, experts_ms / experts_floor_ms, route_ms,
                bytes / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
  }
}

void run_perf(const PerfOptions& options) {
  const ModelConfig config = preset_config(options.preset);
  require(options.iterations >= 1, "perf micro: --iterations must be >= 1");
  CudaBackend backend;
  uint64_t seed = options.seed;
  spdlog::info("perf micro: {} on {}", options.preset, backend.device_description());
  std::printf("\n| format | tokens | experts hit | floor ms (route + experts) | ms (graph) | time / floor | experts floor "
              "ms | experts ms | time / floor | route ms | TB/s |\n| --- | --- | --- | --- | --- | --- | --- | --- | "
              "--- | --- | --- |\n");
  for (const std::string& name : options.formats) {
    const std::optional<QuantScheme> scheme = quant_scheme_from_name(name);
    require(scheme && *scheme != QuantScheme::Fp8Block, "perf micro: --formats takes mxfp8 and nvfp4, got {}", name);
    bench_moe(backend, config, *scheme, seed, options);
  }
}
#endif

}  // namespace

void add_micro_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "micro", "Time one MoE layer with MXFP8 / NVFP4 experts on the GPU (random on-device codes; route + experts and "
               "the experts alone, as CUDA graphs) next to the floor of the bytes each format reads");
  command->add_option("--preset", options->preset, "model shape")->capture_default_str();
  command->add_option("--formats", options->formats, "mxfp8, nvfp4")->delimiter(',')->capture_default_str();
  command->add_option("--tokens", options->tokens, "MoE token counts")->delimiter(',')->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed replays per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random weights")->capture_default_str();
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("micro");
#endif
  });
}

}  // namespace beamline::backend_ops

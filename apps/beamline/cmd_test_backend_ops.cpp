// beamline test-backend-ops: every op of one backend (default cuda) against the reference backend (cpu) on fresh
// random inputs at Beam-1.0's real shapes, odd sizes and window/block boundaries (llama.cpp test-backend-ops
// discipline). Outputs start as NaN so unwritten elements fail; NaN never passes; the error is
// ‖out − ref‖ / ‖ref‖ against a tolerance set by the precision. Prints a table; exits 1 when any case fails.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "commands.h"
#include "quant/activation_quant.h"
#include "quant/quantize.h"
#include "util/error.h"

#ifdef BEAMLINE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace beamline::cli {
namespace {

constexpr double kF32Tolerance = 1e-5;
// BF16/F16 weights times F32 activations: the CUDA GEMMs split each activation into two 16-bit operands, so their
// error is near FP32's (measured up to 7e-5 with K = 20480 on the tensor cores, whose FP32 accumulation is not
// IEEE), not a BF16 rounding's (2^-9: it would pass 1e-2 and fails the whole-model comparison).
constexpr double kSplitOperandTolerance = 2e-4;
// One BF16 rounding of the tensor-core operands (compute dtype BFloat16), as in prefill attention: q and the
// softmax probabilities P keep 8 significant bits (2^-9 relative) before their products with exact BF16 K and V,
// which on these inputs gives a few 1e-3 of relative error in the output; 1e-2 leaves room for that and still
// fails a lost or doubled tile. The masks and key ranges are the same code in both precisions and are held to
// kF32Tolerance by the Float32 run of every case.
constexpr double kBf16OperandTolerance = 1e-2;
// Up to these many rows the CUDA backend streams BF16/F16 weights whose width is a multiple of 8 through the CUDA
// cores with F32 activations whatever the --dtype: exact products, so the F32 tolerance applies. q|k|v in one launch
// and the LM head stream up to 2 rows (CudaBackend::kStreamingMaxRows), a lone projection and the dense SwiGLU (as a
// one-expert MoE) 1 (kStreamingSingleMaxRows).
constexpr int64_t kStreamingRows = 2;
constexpr int64_t kStreamingSingleRows = 1;

struct Options {
  std::string device = "cuda", reference = "cpu", filter, dtype = "float32";
  uint64_t seed = 0;
  bool small_only = false;
};

struct Result {
  std::string op, shape;
  double error = 0.0, tolerance = 0.0;
  std::string note;
  bool passed = false;
  double seconds = 0.0;
};

// Host data shared by both backends; weights stay alive here because the CPU backend borrows them.
class Inputs {
 public:
  explicit Inputs(uint64_t seed) : rng_(seed) {}

  std::vector<float> uniform(int64_t n, float scale = 1.0f) {
    std::uniform_real_distribution<float> distribution(-scale, scale);
    std::vector<float> values(static_cast<std::size_t>(n));
    for (float& v : values) v = distribution(rng_);
    return values;
  }
  // Stored bytes of a random tensor of `dtype` (F32, BF16 or F16), kept alive by this object.
  TensorView weight(DType dtype, std::vector<int64_t> shape, float scale) {
    TensorView view;
    view.name = fmt::format("random {}", shape_string(shape));
    view.dtype = dtype;
    view.shape = std::move(shape);
    const int64_t n = view.numel();
    auto& bytes = storage_.emplace_back(static_cast<std::size_t>(n) * dtype_size(dtype));
    // A fast generator: multi-gigabyte expert stacks must not take minutes.
    uint64_t state = rng_();
    auto next = [&state] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return static_cast<float>(state >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    };
    if (dtype == DType::BF16) {
      auto* out = reinterpret_cast<uint16_t*>(bytes.data());
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(next() * scale);
    } else if (dtype == DType::F16) {
      auto* out = reinterpret_cast<uint16_t*>(bytes.data());
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(next() * scale);
    } else {
      auto* out = reinterpret_cast<float*>(bytes.data());
      for (int64_t i = 0; i < n; ++i) out[i] = next() * scale;
    }
    view.data = bytes.data();
    view.nbytes = bytes.size();
    return view;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::vector<std::vector<std::byte>> storage_;
};

std::vector<float> as_f32(Backend& backend, const Tensor& tensor) {
  if (tensor.dtype() == DType::F32) return backend.download_f32(tensor);
  std::vector<float> values(static_cast<std::size_t>(tensor.numel()));
  if (tensor.dtype() == DType::I32) {
    const std::vector<int32_t> ints = backend.download_i32(tensor);
    std::copy(ints.begin(), ints.end(), values.begin());
    return values;
  }
  require(tensor.dtype() == DType::BF16, "test-backend-ops: cannot compare {} tensors", dtype_name(tensor.dtype()));
  std::vector<uint16_t> bits(values.size());
  backend.download(tensor, bits.data());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_f32(bits[i]);
  return values;
}

// ‖out − ref‖ / ‖ref‖, infinite when either holds a NaN (poison left in place or a NaN computed).
double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  require(out.size() == ref.size(), "test-backend-ops: {} values against {}", out.size(), ref.size());
  double difference = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i]) || std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(out[i]) - ref[i];
    difference += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm > 0.0 ? std::sqrt(difference / norm) : std::sqrt(difference);
}

// The two backends and the running table.
class Harness {
 public:
  Harness(Backend& device, Backend& reference, const Options& options)
      : device_(device), reference_(reference), options_(options), inputs_(options.seed) {}

  Inputs& inputs() { return inputs_; }
  Backend& device() { return device_; }
  Backend& reference() { return reference_; }
  bool small_only() const { return options_.small_only; }
  // --filter is a comma-separated list; an op group runs when its name contains any entry.
  bool wanted(std::string_view op) const {
    if (options_.filter.empty()) return true;
    std::string_view rest = options_.filter;
    for (;;) {
      const std::size_t comma = rest.find(',');
      if (op.find(rest.substr(0, comma)) != op.npos) return true;
      if (comma == rest.npos) return false;
      rest.remove_prefix(comma + 1);
    }
  }
  // The tolerance of an op whose products run on the device's matrix units, for the --dtype under test.
  double operand_tolerance() const {
    return device_.compute_dtype() == ComputeDType::BFloat16 ? kBf16OperandTolerance : kSplitOperandTolerance;
  }
  // A projection's: exact where the weights stream (up to `streamed_rows` rows), else on the matrix units.
  double projection_tolerance(int64_t rows, int64_t in, DType dtype, int64_t streamed_rows) const {
    if (dtype == DType::F32 || (rows <= streamed_rows && in % 8 == 0)) return kF32Tolerance;
    return operand_tolerance();
  }

  // The same tensor on both backends.
  struct Pair {
    Tensor device, reference;
  };
  Pair f32(const std::vector<float>& values, std::vector<int64_t> shape) {
    return {device_.upload_f32(values, shape), reference_.upload_f32(values, shape)};
  }
  Pair i32(const std::vector<int32_t>& values, std::vector<int64_t> shape) {
    return {device_.upload_i32(values, shape), reference_.upload_i32(values, shape)};
  }
  Pair weight(const TensorView& view) { return {device_.load_weight(view), reference_.load_weight(view)}; }
  Pair random_weight(DType dtype, std::vector<int64_t> shape, float scale) {
    return weight(inputs_.weight(dtype, std::move(shape), scale));
  }
  // An output filled with the poison (NaN, or -1 for I32) on both backends.
  Pair poisoned(DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (dtype == DType::I32) return i32(std::vector<int32_t>(static_cast<std::size_t>(n), -1), shape);
    return f32(std::vector<float>(static_cast<std::size_t>(n), std::numeric_limits<float>::quiet_NaN()), shape);
  }
  AttentionBatch batch(Backend& backend, const std::vector<int32_t>& positions, const std::vector<int32_t>& query_start,
                       const std::vector<int32_t>& seq_lens) {
    return backend.make_attention_batch(positions, query_start, seq_lens);
  }

  void record(std::string op, std::string shape, const Pair& out, double tolerance, double seconds,
              std::string note = {}) {
    Result result{std::move(op), std::move(shape), 0.0, tolerance, std::move(note), false, seconds};
    result.error = relative_error(as_f32(device_, out.device), as_f32(reference_, out.reference));
    result.passed = result.error <= tolerance;
    print(result);
    results_.push_back(std::move(result));
  }
  void record_result(Result result) {
    print(result);
    results_.push_back(std::move(result));
  }

  int failures() const {
    return static_cast<int>(std::count_if(results_.begin(), results_.end(), [](const Result& r) { return !r.passed; }));
  }
  void print_table() const {
    std::printf("\n| op | shape | error | tolerance | result | note |\n| --- | --- | --- | --- | --- | --- |\n");
    for (const Result& r : results_)
      std::printf("| %s | %s | %.3g | %.0e | %s | %s |\n", r.op.c_str(), r.shape.c_str(), r.error, r.tolerance,
                  r.passed ? "pass" : "**FAIL**", r.note.c_str());
    std::printf("\n%zu cases, %d failed\n", results_.size(), failures());
  }

 private:
  static void print(const Result& r) {
    spdlog::info("{:<16} {:<52} error {:<10.3g} tol {:.0e}  {} ({:.2f} s){}", r.op, r.shape, r.error, r.tolerance,
                 r.passed ? "pass" : "FAIL", r.seconds, r.note.empty() ? "" : "  " + r.note);
  }

  Backend& device_;
  Backend& reference_;
  const Options& options_;
  Inputs inputs_;
  std::vector<Result> results_;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void test_embedding(Harness& harness) {
  for (auto [vocab, hidden, dtype] : {std::tuple{997L, 5120L, DType::BF16}, {1000L, 67L, DType::F32}}) {
    const auto start = std::chrono::steady_clock::now();
    const int64_t rows = 37;
    auto table = harness.random_weight(dtype, {vocab, hidden}, 1.0f);
    std::vector<int32_t> ids(rows);
    for (auto& id : ids) id = static_cast<int32_t>(harness.inputs().rng()() % static_cast<uint64_t>(vocab));
    ids.back() = static_cast<int32_t>(vocab - 1);
    auto tokens = harness.i32(ids, {rows});
    auto out = harness.poisoned(DType::F32, {rows, hidden});
    harness.device().embedding(table.device, tokens.device, out.device);
    harness.reference().embedding(table.reference, tokens.reference, out.reference);
    harness.record("embedding", fmt::format("V {} H {} {}", vocab, hidden, dtype_name(dtype)), out, kF32Tolerance,
                   seconds_since(start));
  }
}

// The next step's token ids from the previous step's device samples, and their read-back queued behind later work.
void test_place_tokens(Harness& harness) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t sampled = 300, rows = 517;
  std::vector<int32_t> source_ids(sampled), token_ids(rows), pairs;
  for (auto& id : source_ids) id = static_cast<int32_t>(harness.inputs().rng()() % 201088);
  for (auto& id : token_ids) id = static_cast<int32_t>(harness.inputs().rng()() % 201088);
  for (int32_t row = 0; row < rows; row += 3)
    pairs.insert(pairs.end(), {row, (row * 7) % static_cast<int32_t>(sampled)});
  auto source = harness.i32(source_ids, {sampled});
  auto tokens = harness.i32(token_ids, {rows});
  harness.device().place_tokens(source.device, pairs, tokens.device);
  harness.reference().place_tokens(source.reference, pairs, tokens.reference);
  harness.record("place_tokens", fmt::format("{} of {} rows from {}", pairs.size() / 2, rows, sampled), tokens,
                 0.0, seconds_since(start));

  // Queued behind an op that overwrites the source afterwards: the read-back must see the values of its turn.
  std::vector<int32_t> read(static_cast<std::size_t>(rows), -1);
  const std::unique_ptr<PendingDownload> pending = harness.device().download_later(tokens.device, read.data());
  harness.device().place_tokens(source.device, std::vector<int32_t>{0, 1}, tokens.device);
  pending->wait();
  std::vector<int32_t> expected = harness.reference().download_i32(tokens.reference);
  Result result{"download_later", fmt::format("{} I32 behind a later op", rows), 0.0, 0.0, {}, read == expected,
                seconds_since(start)};
  result.error = read == expected ? 0.0 : 1.0;
  harness.record_result(std::move(result));
}

void test_norms(Harness& harness) {
  for (auto [rows, hidden] : {std::pair{1L, 5120L}, {64L, 5120L}, {7L, 1000L}, {3L, 64L}}) {
    const auto start = std::chrono::steady_clock::now();
    auto weight = harness.random_weight(DType::BF16, {hidden}, 1.0f);
    auto x = harness.f32(harness.inputs().uniform(rows * hidden, 3.0f), {rows, hidden});
    auto out = harness.poisoned(DType::F32, {rows, hidden});
    harness.device().rms_norm(x.device, weight.device, 1e-6f, out.device);
    harness.reference().rms_norm(x.reference, weight.reference, 1e-6f, out.reference);
    harness.record("rms_norm", fmt::format("T {} H {}", rows, hidden), out, kF32Tolerance, seconds_since(start));

    auto residual = harness.f32(harness.inputs().uniform(rows * hidden), {rows, hidden});
    harness.device().add_rms_norm(residual.device, x.device, weight.device, 1e-6f, 0.098f);
    harness.reference().add_rms_norm(residual.reference, x.reference, weight.reference, 1e-6f, 0.098f);
    harness.record("add_rms_norm", fmt::format("T {} H {} scale 0.098", rows, hidden), residual, kF32Tolerance,
                   seconds_since(start));
  }
}

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

void test_rope_ssmax(Harness& harness) {
  for (auto [heads, dim] : {std::pair{48, 128}, {8, 128}, {3, 16}}) {
    const auto start = std::chrono::steady_clock::now();
    const int64_t rows = 37;
    std::vector<int32_t> positions(rows);
    for (auto& p : positions) p = static_cast<int32_t>(harness.inputs().rng()() % 1000000);
    positions[0] = 0;
    positions[1] = 511;
    positions[2] = 512;
    auto pos = harness.i32(positions, {rows});
    auto x = harness.f32(harness.inputs().uniform(rows * heads * dim), {rows, int64_t{heads} * dim});
    harness.device().rope(x.device, pos.device, heads, dim, 10000.0f);
    harness.reference().rope(x.reference, pos.reference, heads, dim, 10000.0f);
    harness.record("rope", fmt::format("T {} {}x{} positions to 1e6", rows, heads, dim), x, kF32Tolerance,
                   seconds_since(start));
    harness.device().ssmax_scale(x.device, pos.device, 2048.0f, 0.1f);
    harness.reference().ssmax_scale(x.reference, pos.reference, 2048.0f, 0.1f);
    harness.record("ssmax_scale", fmt::format("T {} width {}", rows, heads * dim), x, kF32Tolerance,
                   seconds_since(start));
  }
}

// write_kv then paged_attention over a shared random pool: sequences given as (cached positions, new tokens).
struct AttentionCase {
  std::string what;
  int32_t heads, kv_heads, dim, block_size, window;
  DType kv_dtype;
  std::vector<std::pair<int32_t, int32_t>> sequences;
  // >= 0: that sequence's first block is given back although its queries need it; the device must write NaN
  // for its rows (backend/cuda/attention/attention.h) and finite values elsewhere, and there is no reference (the CPU backend throws).
  int32_t drop_sequence = -1;
};

// The rows of the dropped sequence are all NaN, every other row is finite.
void record_missing_block(Harness& harness, const std::string& shape, const Tensor& out,
                          const std::vector<int32_t>& query_start, int32_t dropped, double seconds) {
  const std::vector<float> values = harness.device().download_f32(out);
  const int64_t width = out.dim(1);
  int64_t wrong = 0;
  for (int64_t row = 0; row < out.dim(0); ++row) {
    const bool poisoned = row >= query_start[dropped] && row < query_start[dropped + 1];
    for (int64_t i = 0; i < width; ++i)
      wrong += std::isnan(values[static_cast<std::size_t>(row * width + i)]) != poisoned;
  }
  harness.record_result({"paged_attention", shape, static_cast<double>(wrong), 0.0,
                         "missing block: its rows NaN, others finite (error = wrong elements)", wrong == 0, seconds});
}

void test_attention_case(Harness& harness, const AttentionCase& c, ComputeDType compute) {
  const auto start = std::chrono::steady_clock::now();
  const int32_t slots = 2, slot = 1;
  std::vector<int32_t> positions, query_start{0}, seq_lens;
  int32_t width = 1, total_blocks = 0;
  for (auto [cached, added] : c.sequences) {
    for (int32_t i = 0; i < added; ++i) positions.push_back(cached + i);
    query_start.push_back(query_start.back() + added);
    seq_lens.push_back(cached + added);
    const int32_t blocks = (cached + added + c.block_size - 1) / c.block_size;
    width = std::max(width, blocks);
    total_blocks += blocks;
  }
  const int32_t pool_blocks = total_blocks + 3;
  // Blocks in a shuffled order; for windowed layers, blocks wholly before every query's window are given back.
  std::vector<int32_t> order(static_cast<std::size_t>(pool_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), harness.inputs().rng());
  std::vector<int32_t> table(c.sequences.size() * static_cast<std::size_t>(width), -1);
  std::size_t next = 0;
  for (std::size_t s = 0; s < c.sequences.size(); ++s) {
    const auto [cached, added] = c.sequences[s];
    const int32_t blocks = (cached + added + c.block_size - 1) / c.block_size;
    const int32_t first_visible = c.window > 0 ? std::max(0, cached - c.window + 1) : 0;
    for (int32_t b = 0; b < blocks; ++b) {
      const int32_t block = order[next++];
      const bool dropped = static_cast<int32_t>(s) == c.drop_sequence && b == 0;
      if ((b + 1) * c.block_size > first_visible && !dropped) table[s * static_cast<std::size_t>(width) + b] = block;
    }
  }
  const auto rows = static_cast<int64_t>(positions.size());
  const auto sequences = static_cast<int64_t>(c.sequences.size());
  const std::vector<int64_t> pool_shape{pool_blocks, slots, c.block_size, c.kv_heads, c.dim};
  const int64_t pool_elements = int64_t{pool_blocks} * slots * c.block_size * c.kv_heads * c.dim;
  auto pool_tensor = [&](Backend& backend, const std::vector<float>& values) {
    if (c.kv_dtype == DType::F32) return backend.upload_f32(values, pool_shape);
    std::vector<uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
    return backend.upload(bits.data(), DType::BF16, pool_shape);
  };
  const std::vector<float> k_pool = harness.inputs().uniform(pool_elements), v_pool = harness.inputs().uniform(pool_elements);
  PagedKvPool device_pool{pool_tensor(harness.device(), k_pool), pool_tensor(harness.device(), v_pool)};
  PagedKvPool reference_pool{pool_tensor(harness.reference(), k_pool), pool_tensor(harness.reference(), v_pool)};
  auto block_table = harness.i32(table, {sequences, width});
  const AttentionBatch device_batch = harness.batch(harness.device(), positions, query_start, seq_lens);
  const AttentionBatch reference_batch = harness.batch(harness.reference(), positions, query_start, seq_lens);
  const int64_t kv_width = int64_t{c.kv_heads} * c.dim, q_width = int64_t{c.heads} * c.dim;
  auto k = harness.f32(harness.inputs().uniform(rows * kv_width), {rows, kv_width});
  auto v = harness.f32(harness.inputs().uniform(rows * kv_width), {rows, kv_width});
  auto q = harness.f32(harness.inputs().uniform(rows * q_width), {rows, q_width});
  const std::string shape = fmt::format("{} q{}/kv{}x{} bs {} win {} {}", c.what, c.heads, c.kv_heads, c.dim,
                                        c.block_size, c.window, dtype_name(c.kv_dtype));

  harness.device().write_kv(k.device, v.device, device_pool, slot, block_table.device, device_batch);
  harness.reference().write_kv(k.reference, v.reference, reference_pool, slot, block_table.reference, reference_batch);
  harness.record("write_kv", shape, {device_pool.k, reference_pool.k}, 0.0, seconds_since(start), "K pool, exact");
  harness.record("write_kv", shape, {device_pool.v, reference_pool.v}, 0.0, seconds_since(start), "V pool, exact");

  AttentionParams params;
  params.num_heads = c.heads;
  params.num_kv_heads = c.kv_heads;
  params.head_dim = c.dim;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  params.sliding_window = c.window;
  params.slot = slot;
  auto out = harness.poisoned(DType::F32, {rows, q_width});
  const ComputeDType harness_dtype = harness.device().compute_dtype();
  harness.device().set_compute_dtype(compute);
  harness.device().paged_attention(q.device, device_pool, block_table.device, device_batch, params, out.device);
  harness.device().set_compute_dtype(harness_dtype);
  const bool bf16 = compute == ComputeDType::BFloat16;
  if (c.drop_sequence >= 0) {
    record_missing_block(harness, bf16 ? shape + " compute bf16" : shape, out.device, query_start, c.drop_sequence,
                         seconds_since(start));
    return;
  }
  harness.reference().paged_attention(q.reference, reference_pool, block_table.reference, reference_batch, params,
                                      out.reference);
  harness.record("paged_attention", shape, out, bf16 ? kBf16OperandTolerance : kF32Tolerance, seconds_since(start),
                 bf16 ? "compute bfloat16" : "");
}

void test_attention(Harness& harness) {
  std::vector<AttentionCase> cases{
      {"decode", 48, 8, 128, 16, 0, DType::F32, {{0, 1}, {15, 1}, {16, 1}, {600, 1}}},
      {"decode", 48, 8, 128, 16, 512, DType::BF16, {{510, 1}, {511, 1}, {512, 1}, {1500, 1}}},
      {"varlen prefill", 4, 2, 16, 8, 8, DType::F32, {{0, 1}, {5, 17}, {33, 40}}},
      {"chunked prefill", 48, 8, 128, 16, 512, DType::F32, {{530, 70}, {0, 129}}},
      {"prefill global", 8, 2, 128, 16, 0, DType::BF16, {{0, 300}, {7, 9}}},
      {"odd dims", 6, 3, 40, 4, 5, DType::F32, {{3, 11}, {0, 2}}},
      // Split-KV decode (<= 4 query rows per sequence) and tiled prefill (more) at head_dim 128: long contexts,
      // split and window boundaries, block sizes, GQA groups, mixed batches.
      {"decode split ends", 48, 8, 128, 16, 0, DType::BF16,
       {{126, 1}, {127, 1}, {128, 1}, {4094, 1}, {4095, 1}, {4096, 1}, {0, 1}, {31, 1}}},
      {"decode 8K window", 48, 8, 128, 16, 512, DType::BF16, {{8190, 1}, {8191, 1}, {511, 1}, {512, 1}, {513, 1}}},
      {"decode bs 32", 48, 8, 128, 32, 0, DType::F32, {{1000, 1}, {33, 1}, {64, 1}}},
      {"decode GQA 6/3", 6, 3, 128, 16, 0, DType::BF16, {{2500, 1}, {17, 1}}},
      {"decode GQA 4/1", 4, 1, 128, 32, 0, DType::F32, {{3000, 1}, {5, 1}}},
      {"decode GQA 10/2", 10, 2, 128, 16, 0, DType::BF16, {{1234, 1}, {99, 1}}},
      {"decode 3 rows", 48, 8, 128, 16, 0, DType::BF16, {{700, 3}, {2, 4}}},
      {"mixed decode+prefill", 48, 8, 128, 16, 0, DType::BF16,
       {{1000, 1}, {0, 100}, {300, 2}, {50, 37}, {2000, 4}, {20, 5}, {0, 1}}},
      {"mixed decode+prefill", 48, 8, 128, 16, 512, DType::F32,
       {{1000, 1}, {0, 600}, {300, 2}, {450, 77}, {2000, 4}, {20, 5}}},
      {"prefill bs 32", 48, 8, 128, 32, 0, DType::F32, {{0, 333}, {40, 70}}},
      {"prefill GQA 6/3", 6, 3, 128, 16, 7, DType::BF16, {{0, 150}, {10, 31}}},
      {"prefill GQA 4/1", 4, 1, 128, 16, 0, DType::BF16, {{5, 200}}},
      {"prefill GQA 10/2", 10, 2, 128, 16, 64, DType::F32, {{100, 130}}},
      // The tensor-core decode kernel (BF16 pools): 16-key tile edges, a single row over many splits, windows that
      // start inside a tile, blocks smaller and larger than a tile, groups 1 to 8, speculative chunks.
      {"decode tile edges", 48, 8, 128, 16, 0, DType::BF16,
       {{14, 1}, {15, 1}, {16, 1}, {17, 1}, {31, 1}, {47, 2}, {63, 4}, {1, 1}}},
      {"decode 1 row 8K", 48, 8, 128, 16, 0, DType::BF16, {{8191, 1}}},
      {"decode 1 row window", 48, 8, 128, 16, 100, DType::BF16, {{2047, 1}}},
      {"decode window 512 edges", 48, 8, 128, 16, 512, DType::BF16, {{527, 1}, {528, 1}, {529, 1}, {1000, 4}}},
      {"decode bs 4", 48, 8, 128, 4, 0, DType::BF16, {{500, 1}, {37, 1}, {6, 2}}},
      {"decode bs 8 window", 48, 8, 128, 8, 30, DType::BF16, {{300, 1}, {29, 3}}},
      {"decode bs 64", 48, 8, 128, 64, 0, DType::BF16, {{1500, 1}, {64, 1}, {63, 4}}},
      {"decode GQA 64/8", 64, 8, 128, 16, 0, DType::BF16, {{3000, 1}, {200, 4}}},
      {"decode GQA 14/2", 14, 2, 128, 16, 0, DType::BF16, {{777, 1}, {12, 2}}},
      {"decode GQA 8/8", 8, 8, 128, 16, 0, DType::BF16, {{1024, 1}, {3, 1}}},
      {"decode GQA 32/8 window", 32, 8, 128, 32, 512, DType::BF16, {{4000, 4}, {600, 1}}},
      {"decode 2 rows", 48, 8, 128, 16, 512, DType::BF16, {{5000, 2}, {0, 2}, {511, 2}}},
      // The tensor-core prefill kernel (BF16 pools): chunks after cached keys, windows, block sizes, groups 1-8.
      {"chunked prefill", 48, 8, 128, 16, 512, DType::BF16, {{530, 70}, {0, 129}}},
      {"chunked prefill long", 48, 8, 128, 16, 0, DType::BF16, {{2000, 150}, {31, 33}}},
      {"prefill bs 8", 48, 8, 128, 8, 0, DType::BF16, {{0, 200}, {61, 67}}},
      {"prefill bs 64 GQA 64/8", 64, 8, 128, 64, 0, DType::BF16, {{3, 250}}},
      {"prefill window 100 GQA 16/2", 16, 2, 128, 16, 100, DType::BF16, {{0, 300}, {250, 90}}},
      {"prefill MHA 8/8", 8, 8, 128, 16, 0, DType::BF16, {{0, 140}, {17, 6}}},
      // The wgmma kernel's tiling: 128-key tiles and 64-vector warpgroups, lengths off those multiples (22 rows:
      // one more than a tile of group 6), windows narrower than a tile, so that one warpgroup of a block skips a
      // key tile the other one uses.
      {"prefill tile edges", 48, 8, 128, 16, 0, DType::BF16, {{0, 127}, {0, 129}, {64, 191}, {1, 22}}},
      {"prefill window 5", 48, 8, 128, 16, 5, DType::BF16, {{0, 200}, {300, 45}}},
      {"prefill window 5 MHA 8/8", 8, 8, 128, 16, 5, DType::BF16, {{0, 300}, {40, 129}}},
      {"missing block, decode", 48, 8, 128, 16, 0, DType::BF16, {{3000, 1}, {5000, 1}, {40, 1}}, 1},
      {"missing block, 1 row", 48, 8, 128, 16, 0, DType::BF16, {{40, 1}, {6000, 1}}, 1},
      {"missing block, prefill", 48, 8, 128, 16, 0, DType::BF16, {{40, 1}, {64, 70}, {20, 9}}, 1},
      {"missing block, generic", 6, 3, 40, 4, 0, DType::F32, {{40, 3}, {8, 2}}, 0},
  };
  if (!harness.small_only()) {
    cases.push_back({"decode 32K", 48, 8, 128, 16, 0, DType::BF16, {{32767, 1}, {20000, 1}}});
    cases.push_back({"decode 32K", 48, 8, 128, 16, 0, DType::F32, {{32767, 1}, {100, 1}}});
    cases.push_back({"prefill global 1K", 48, 8, 128, 16, 0, DType::BF16, {{0, 1024}}});
    cases.push_back({"prefill window 2K", 48, 8, 128, 16, 512, DType::BF16, {{0, 2048}}});
    AttentionCase batch128{"decode B=128", 48, 8, 128, 16, 0, DType::BF16, {}};
    for (int i = 0; i < 128; ++i)
      batch128.sequences.emplace_back(static_cast<int32_t>(harness.inputs().rng()() % 3000), 1);
    cases.push_back(batch128);
  }
  // The CPU backend throws on a missing block instead of writing NaN: those cases are for device backends.
  const bool device_semantics = harness.device().device() != Device::Cpu;
  for (const AttentionCase& c : cases) {
    if (c.drop_sequence >= 0 && !device_semantics) continue;
    test_attention_case(harness, c, ComputeDType::Float32);
    // The compute dtype picks the operands of the tensor-core prefill kernel; cases of one query row per sequence
    // (decode only) run once.
    if (std::any_of(c.sequences.begin(), c.sequences.end(), [](const auto& s) { return s.second > 1; }))
      test_attention_case(harness, c, ComputeDType::BFloat16);
  }
}

void test_route(Harness& harness) {
  struct Case {
    int64_t rows, hidden;
    int32_t experts;
    RouterParams params;
    bool ties;
    const char* what;
  };
  const std::vector<Case> cases{{1, 5120, 256, {8, 4, 8, true, 2.5f}, false, "beam-1.0 decode"},
                                {64, 5120, 256, {8, 4, 8, true, 2.5f}, false, "beam-1.0"},
                                {33, 64, 8, {4, 2, 2, true, 2.5f}, false, "tiny"},
                                {17, 96, 24, {3, 2, 5, false, 1.0f}, false, "odd, unnormalised"},
                                {40, 128, 64, {8, 3, 6, true, 2.5f}, true, "exact ties"}};
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> router = harness.inputs().uniform(int64_t{c.experts} * c.hidden, 0.05f);
    std::vector<float> bias = harness.inputs().uniform(c.experts, 0.01f);
    if (c.ties)  // experts 2i and 2i+1 identical: every choice between them is a tie, the lower index must win
      for (int32_t e = 1; e < c.experts; e += 2) {
        std::copy_n(router.begin() + (e - 1) * c.hidden, c.hidden, router.begin() + e * c.hidden);
        bias[static_cast<std::size_t>(e)] = bias[static_cast<std::size_t>(e - 1)];
      }
    auto router_tensor = harness.f32(router, {c.experts, c.hidden});
    auto bias_tensor = harness.f32(bias, {c.experts});
    auto h = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
    auto ids = harness.poisoned(DType::I32, {c.rows, c.params.top_k});
    auto weights = harness.poisoned(DType::F32, {c.rows, c.params.top_k});
    harness.device().route(h.device, router_tensor.device, bias_tensor.device, c.params, ids.device, weights.device);
    harness.reference().route(h.reference, router_tensor.reference, bias_tensor.reference, c.params, ids.reference,
                              weights.reference);
    const std::vector<int32_t> device_ids = harness.device().download_i32(ids.device);
    const std::vector<int32_t> reference_ids = harness.reference().download_i32(ids.reference);
    int64_t mismatched = 0;
    for (int64_t r = 0; r < c.rows; ++r)
      mismatched += !std::equal(device_ids.begin() + r * c.params.top_k, device_ids.begin() + (r + 1) * c.params.top_k,
                                reference_ids.begin() + r * c.params.top_k);
    const std::string shape = fmt::format("T {} E {} H {} groups {}/{} top {} ({})", c.rows, c.experts, c.hidden,
                                          c.params.n_group, c.params.topk_group, c.params.top_k, c.what);
    Result result{"route ids", shape, static_cast<double>(mismatched), 0.0,
                  fmt::format("{} of {} rows differ", mismatched, c.rows), mismatched == 0, seconds_since(start)};
    harness.record_result(std::move(result));
    harness.record("route weights", shape, weights, kF32Tolerance, seconds_since(start));
  }
}

// Expert ids of `rows` tokens: top_k distinct experts each, in random order; weights positive.
std::pair<std::vector<int32_t>, std::vector<float>> random_assignment(Inputs& inputs, int64_t rows, int32_t experts,
                                                                      int32_t top_k) {
  std::vector<int32_t> ids, all(static_cast<std::size_t>(experts));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t r = 0; r < rows; ++r) {
    std::shuffle(all.begin(), all.end(), inputs.rng());
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  std::vector<float> weights = inputs.uniform(rows * top_k, 0.5f);
  for (float& w : weights) w += 0.6f;
  return {ids, weights};
}

// Expert ids of `rows` tokens giving expert e exactly counts[e] slots (each at most `rows`, rows * top_k in all):
// the experts laid out in order and slot (t, j) taking entry j * rows + t, so no token meets an expert twice; each
// token's j order is then shuffled.
std::vector<int32_t> assignment_with_counts(Inputs& inputs, const std::vector<int32_t>& counts, int64_t rows,
                                            int32_t top_k) {
  std::vector<int32_t> layout;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    require(counts[e] <= rows, "test-backend-ops: moe case gives expert {} {} of {} tokens", e, counts[e], rows);
    layout.insert(layout.end(), static_cast<std::size_t>(counts[e]), static_cast<int32_t>(e));
  }
  require(static_cast<int64_t>(layout.size()) == rows * top_k, "test-backend-ops: moe case counts sum to {}, not {}",
          layout.size(), rows * top_k);
  std::vector<int32_t> ids(layout.size());
  for (int64_t t = 0; t < rows; ++t)
    for (int32_t j = 0; j < top_k; ++j)
      ids[static_cast<std::size_t>(t * top_k + j)] = layout[static_cast<std::size_t>(j * rows + t)];
  for (int64_t t = 0; t < rows; ++t)
    std::shuffle(ids.begin() + t * top_k, ids.begin() + (t + 1) * top_k, inputs.rng());
  return ids;
}

// Slot counts per expert, zero but for the (expert, slots) pairs given.
std::vector<int32_t> sparse_counts(int32_t experts, const std::vector<std::pair<int32_t, int32_t>>& slots) {
  std::vector<int32_t> counts(static_cast<std::size_t>(experts), 0);
  for (const auto& [expert, count] : slots) counts[static_cast<std::size_t>(expert)] = count;
  return counts;
}

void test_moe(Harness& harness) {
  struct Case {
    int64_t rows, hidden, intermediate;
    int32_t experts, top_k, distinct;
    const char* what;
    std::vector<int32_t> counts = {};  // slots per expert; empty: random distinct experts per token
  };
  std::vector<Case> cases{
      {1, 5120, 2560, 256, 8, 31, "beam-1.0 decode: streaming"},
      {64, 5120, 2560, 256, 8, 31, "beam-1.0"},
      {300, 5120, 2560, 256, 8, 31, "beam-1.0 prefill"},
      {208, 5120, 2560, 256, 8, 31, "beam-1.0, tokens per expert 200/65/64/9/8/7/1, most experts idle",
       sparse_counts(256, {{3, 200}, {17, 65}, {42, 64}, {100, 9}, {101, 8}, {200, 7}, {255, 1}, {128, 1}, {5, 187},
                           {6, 187}, {7, 187}, {8, 187}, {9, 187}, {10, 187}, {11, 187}})},
      {1, 64, 32, 8, 2, 8, "tiny, one token: streaming"},
      {2, 64, 32, 8, 2, 8, "tiny, two tokens: the fewest on the tensor cores"},
      {33, 64, 32, 8, 2, 8, "tiny"},
      {70, 200, 72, 12, 3, 12, "odd"},
      {242, 200, 72, 10, 2, 10, "odd, tokens per expert 1/7/8/9/0/64/65/200/0/130",
       {1, 7, 8, 9, 0, 64, 65, 200, 0, 130}},
      {60, 200, 72, 64, 2, 16, "odd, few tokens per expert (16-token tiles): 1/7/8/9/16/17/22/40, most idle",
       sparse_counts(64, {{0, 1}, {5, 7}, {9, 8}, {20, 9}, {33, 16}, {40, 17}, {50, 22}, {63, 40}})},
      {64, 200, 72, 64, 2, 16, "odd, few tokens per expert (bfloat16: wgmma chunks of 16): 64/40/24, most idle",
       sparse_counts(64, {{3, 64}, {10, 40}, {20, 24}})},
      {600, 200, 72, 10, 2, 10,
       "odd, many tokens per expert (bfloat16: wgmma tiles of 128): 0/1/63/64/65/127/128/129/300/323",
       {0, 1, 63, 64, 65, 127, 128, 129, 300, 323}},
      {40, 60, 36, 6, 2, 6, "H not a multiple of 8: grouped GEMM"},
      {256, 256, 128, 8, 8, 8, "every token on every expert: four full tiles each"},
      {1100, 64, 32, 8, 2, 8, "tiny, 1100 tokens: many tiles per expert"}};
  if (harness.small_only()) cases.erase(cases.begin(), cases.begin() + 4);
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    // Beam-sized stacks reuse `distinct` (a prime) random experts cyclically to bound host memory; neighbouring
    // experts still differ, so a wrong expert index shows.
    std::vector<SwigluTensors> device_experts, reference_experts;
    std::vector<Harness::Pair> gate, up, down;
    for (int32_t e = 0; e < c.distinct; ++e) {
      const float in_scale = 1.0f / std::sqrt(static_cast<float>(c.hidden));
      gate.push_back(harness.random_weight(DType::BF16, {c.intermediate, c.hidden}, in_scale));
      up.push_back(harness.random_weight(DType::BF16, {c.intermediate, c.hidden}, in_scale));
      down.push_back(harness.random_weight(DType::BF16, {c.hidden, c.intermediate},
                                           1.0f / std::sqrt(static_cast<float>(c.intermediate))));
    }
    MoeTensors device_moe, reference_moe;
    for (int32_t e = 0; e < c.experts; ++e) {
      const auto i = static_cast<std::size_t>(e % c.distinct);
      device_moe.experts.push_back({{gate[i].device, {}, {}}, {up[i].device, {}, {}}, {down[i].device, {}, {}}});
      reference_moe.experts.push_back(
          {{gate[i].reference, {}, {}}, {up[i].reference, {}, {}}, {down[i].reference, {}, {}}});
    }
    harness.device().prepare_moe(device_moe);
    harness.reference().prepare_moe(reference_moe);
    auto [id_values, weight_values] = random_assignment(harness.inputs(), c.rows, c.experts, c.top_k);
    if (!c.counts.empty()) id_values = assignment_with_counts(harness.inputs(), c.counts, c.rows, c.top_k);
    auto ids = harness.i32(id_values, {c.rows, c.top_k});
    auto weights = harness.f32(weight_values, {c.rows, c.top_k});
    auto h = harness.f32(harness.inputs().uniform(c.rows * c.hidden), {c.rows, c.hidden});
    auto out = harness.poisoned(DType::F32, {c.rows, c.hidden});
    harness.device().moe(h.device, ids.device, weights.device, device_moe, out.device);
    harness.reference().moe(h.reference, ids.reference, weights.reference, reference_moe, out.reference);
    harness.record("moe", fmt::format("T {} H {} E {}x{} top {} ({})", c.rows, c.hidden, c.experts, c.intermediate,
                                      c.top_k, c.what),
                   out, harness.operand_tolerance(), seconds_since(start));
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

// ---- sample ----

// Where the reference's decision for one row is fragile under float summation order: the uniform's distance
// from its token's CDF edges, and the top_p target's from the nucleus edge, each as a fraction of the kept mass.
struct SampleMargins {
  double draw = 1.0, nucleus = 1.0;
  std::vector<int32_t> kept_before_top_p, kept;  // token ids, ascending
};

SampleMargins sample_margins(std::vector<float> row, const SampleRow& settings, int32_t token) {
  SampleMargins margins;
  for (float& l : row)
    if (std::isnan(l)) l = -std::numeric_limits<float>::infinity();
  apply_temperature(row, settings.temperature);
  apply_min_p(row, settings.min_p);
  apply_top_k(row, settings.top_k);
  const float best = *std::max_element(row.begin(), row.end());
  if (best == -std::numeric_limits<float>::infinity()) return margins;
  auto weight = [&](float l) {
    return l == -std::numeric_limits<float>::infinity() ? 0.0 : std::exp(static_cast<double>(l - best));
  };
  for (std::size_t t = 0; t < row.size(); ++t)
    if (weight(row[t]) > 0.0) margins.kept_before_top_p.push_back(static_cast<int32_t>(t));
  if (settings.top_p < 1.0f) {
    double total = 0.0;
    for (float l : row) total += weight(l);
    std::vector<int32_t> order = margins.kept_before_top_p;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const double target = settings.top_p * total;
    double cumulative = 0.0;
    for (int32_t t : order) {
      if (cumulative >= target) break;
      cumulative += weight(row[t]);
      margins.nucleus = std::min(margins.nucleus, std::abs(cumulative - target) / total);
    }
    apply_top_p(row, settings.top_p);
  }
  double total = 0.0, before = 0.0;
  for (std::size_t t = 0; t < row.size(); ++t) {
    total += weight(row[t]);
    if (static_cast<int32_t>(t) < token) before += weight(row[t]);
    if (weight(row[t]) > 0.0) margins.kept.push_back(static_cast<int32_t>(t));
  }
  const double after = before + weight(row[static_cast<std::size_t>(token)]);
  margins.draw = std::min(std::abs(settings.uniform - before / total), std::abs(after / total - settings.uniform));
  return margins;
}

// A token that differs from the reference's is accepted only where the reference was fragile: next to its token
// among the kept ones when the uniform sat on the edge, or inside the pre-top_p set when the nucleus edge did.
bool tolerated_mismatch(const SampleMargins& margins, int32_t reference, int32_t device) {
  constexpr double kMargin = 1e-5;
  const auto& kept = margins.kept;
  const auto at = std::lower_bound(kept.begin(), kept.end(), reference);
  const bool neighbour = (at != kept.begin() && *(at - 1) == device) ||
                         (at != kept.end() && at + 1 != kept.end() && *(at + 1) == device);
  if (margins.draw < kMargin && neighbour) return true;
  return margins.nucleus < kMargin &&
         std::binary_search(margins.kept_before_top_p.begin(), margins.kept_before_top_p.end(), device);
}

// Samples `rows` of `logits` [logit_rows, vocab] on both backends (the device twice, timing the second call) and
// records the tokens and the logprobs, naming failing rows by row_mode.
void check_sample(Harness& harness, const std::vector<float>& logits, int64_t logit_rows, int64_t vocab,
                  const std::vector<SampleRow>& rows, const std::vector<const char*>& row_mode, const std::string& shape,
                  std::chrono::steady_clock::time_point start) {
  const auto count = static_cast<int64_t>(rows.size());
  constexpr int64_t kWidth = 20;
  auto input = harness.f32(logits, {logit_rows, vocab});
  auto tokens = harness.poisoned(DType::I32, {count});
  auto logprobs = harness.poisoned(DType::F32, {count});
  auto ranks = harness.poisoned(DType::I32, {count});
  auto top_ids = harness.poisoned(DType::I32, {count, kWidth});
  auto top_logprobs = harness.poisoned(DType::F32, {count, kWidth});
  SampleOutputs device_out{tokens.device, logprobs.device, ranks.device, top_ids.device, top_logprobs.device};
  SampleOutputs reference_out{tokens.reference, logprobs.reference, ranks.reference, top_ids.reference,
                              top_logprobs.reference};
  harness.device().sample(input.device, rows, device_out);
  harness.device().synchronize();
  const auto device_start = std::chrono::steady_clock::now();
  harness.device().sample(input.device, rows, device_out);
  harness.device().synchronize();
  const double device_ms = seconds_since(device_start) * 1e3;
  harness.reference().sample(input.reference, rows, reference_out);

  const std::vector<int32_t> device_tokens = harness.device().download_i32(tokens.device);
  const std::vector<int32_t> reference_tokens = harness.reference().download_i32(tokens.reference);
  const std::vector<float> device_logprobs = harness.device().download_f32(logprobs.device);
  const std::vector<float> reference_logprobs = harness.reference().download_f32(logprobs.reference);
  const std::vector<int32_t> device_ranks = harness.device().download_i32(ranks.device);
  const std::vector<int32_t> reference_ranks = harness.reference().download_i32(ranks.reference);
  const std::vector<int32_t> device_top = harness.device().download_i32(top_ids.device);
  const std::vector<int32_t> reference_top = harness.reference().download_i32(top_ids.reference);
  const std::vector<float> device_top_logprobs = harness.device().download_f32(top_logprobs.device);
  const std::vector<float> reference_top_logprobs = harness.reference().download_f32(top_logprobs.reference);

  int64_t wrong = 0, tolerated = 0, wrong_ids = 0;
  double logprob_error = 0.0;
  std::string failing;
  for (int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<std::size_t>(i);
    const SampleRow& row = rows[index];
    const int32_t reference = reference_tokens[index], device = device_tokens[index];
    bool same = reference == device;
    if (!same) {
      const std::vector<float> raw(logits.begin() + row.logit_row * vocab, logits.begin() + (row.logit_row + 1) * vocab);
      const bool in_range = device >= 0 && device < vocab;
      if (in_range && !row.greedy && tolerated_mismatch(sample_margins(raw, row, reference), reference, device)) {
        ++tolerated;
      } else {
        ++wrong;
        if (failing.find(row_mode[index]) == std::string::npos) failing += fmt::format(" {}", row_mode[index]);
      }
    }
    if (row.num_logprobs < 0) continue;
    if (same) {
      logprob_error = std::max(logprob_error, static_cast<double>(std::abs(device_logprobs[index] - reference_logprobs[index])));
      wrong_ids += device_ranks[index] != reference_ranks[index];
    }
    for (int64_t j = 0; j < row.num_logprobs; ++j) {
      const auto at = static_cast<std::size_t>(i * kWidth + j);
      wrong_ids += device_top[at] != reference_top[at];
      logprob_error = std::max(logprob_error, static_cast<double>(std::abs(device_top_logprobs[at] - reference_top_logprobs[at])));
    }
    if (std::isnan(logprob_error)) logprob_error = std::numeric_limits<double>::infinity();
  }
  harness.record_result({"sample tokens", shape, static_cast<double>(wrong), 0.0,
                         fmt::format("{} near-boundary differences tolerated; device {:.3f} ms{}{}", tolerated, device_ms,
                                     failing.empty() ? "" : "; failing:", failing),
                         wrong == 0, seconds_since(start)});
  harness.record_result({"sample logprobs", shape, logprob_error, 1e-4, fmt::format("{} rank/top-id differences", wrong_ids),
                         logprob_error <= 1e-4 && wrong_ids == 0, seconds_since(start)});
}

struct SampleMode {
  const char* name;
  SampleRow settings;
};

SampleMode sample_mode(const char* name, bool greedy, float temperature, float min_p, int32_t top_k, float top_p) {
  SampleRow row;
  row.greedy = greedy;
  row.temperature = temperature;
  row.min_p = min_p;
  row.top_k = top_k;
  row.top_p = top_p;
  return SampleMode{name, row};
}

void test_sample(Harness& harness) {
  const std::vector<SampleMode> modes{sample_mode("greedy", true, 1.0f, 0.0f, 0, 1.0f),
                                      sample_mode("temperature", false, 0.7f, 0.0f, 0, 1.0f),
                                      sample_mode("top_k 1", false, 1.0f, 0.0f, 1, 1.0f),
                                      sample_mode("top_k 50", false, 1.3f, 0.0f, 50, 1.0f),
                                      sample_mode("top_p 0.9", false, 1.0f, 0.0f, 0, 0.9f),
                                      sample_mode("top_p 1e-6", false, 1.0f, 0.0f, 0, 1e-6f),
                                      sample_mode("min_p 0.1", false, 1.0f, 0.1f, 0, 1.0f),
                                      sample_mode("combined", false, 0.8f, 0.05f, 40, 0.95f)};
  // On the CUDA backend 8 and 16 rows split each row over a cluster of 8 blocks, 56 over 2, 512 not at all.
  for (int64_t vocab : {201088L, 4096L, 1000L, 1001L}) {
    for (int64_t logit_rows : {1L, 2L, 7L, 64L}) {
      const auto start = std::chrono::steady_clock::now();
      // LM-like logits (a few dominant tokens); every fourth row has few distinct values (ties everywhere) and
      // row 2 holds NaNs.
      std::normal_distribution<float> normal(0.0f, 4.0f);
      std::vector<float> logits(static_cast<std::size_t>(logit_rows * vocab));
      for (float& l : logits) l = normal(harness.inputs().rng());
      for (int64_t r = 3; r < logit_rows; r += 4)
        for (int64_t t = 0; t < vocab; ++t) logits[r * vocab + t] = std::round(logits[r * vocab + t] / 3.0f);
      if (logit_rows > 2)
        for (int64_t t = 0; t < vocab; t += 7) logits[2 * vocab + t] = std::numeric_limits<float>::quiet_NaN();
      std::vector<SampleRow> rows;
      std::vector<const char*> row_mode;
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      for (const SampleMode& m : modes) {
        for (int64_t r = 0; r < logit_rows; ++r) {
          SampleRow row = m.settings;
          row.logit_row = static_cast<int32_t>(r);
          row.uniform = uniform(harness.inputs().rng());
          row.num_logprobs = rows.size() % 3 == 0 ? -1 : (rows.size() % 3 == 1 ? 0 : (rows.size() % 2 ? 5 : 20));
          rows.push_back(row);
          row_mode.push_back(m.name);
        }
      }
      check_sample(harness, logits, logit_rows, vocab, rows, row_mode,
                   fmt::format("V {} R {} ({} rows, {} modes)", vocab, logit_rows, rows.size(), modes.size()), start);
    }
  }
  // Rows that reach the device's less common paths (its selection sorts tokens into levels by their distance
  // from the maximum, gathers the level that holds a cut when it fits in shared memory and searches the row
  // otherwise): no finite logit; one value everywhere; more distinct values in one level than fit; values on
  // the level edges, each tied many times; three finite values (top_k and the top logprobs beyond them).
  const std::vector<SampleMode> edge_modes{sample_mode("greedy", true, 1.0f, 0.0f, 0, 1.0f),
                                           sample_mode("temperature 1", false, 1.0f, 0.0f, 0, 1.0f),
                                           sample_mode("top_k 50", false, 1.0f, 0.0f, 50, 1.0f),
                                           sample_mode("top_p 0.5", false, 1.0f, 0.0f, 0, 0.5f),
                                           sample_mode("top_p 1", false, 0.9f, 0.0f, 0, 1.0f),
                                           sample_mode("min_p 0.2", false, 1.0f, 0.2f, 0, 1.0f),
                                           sample_mode("top_k 3 top_p 0.9", false, 1.0f, 0.0f, 3, 0.9f),
                                           sample_mode("top_k V-1 top_p 0.99", false, 1.0f, 0.0f, -1, 0.99f)};
  for (int64_t vocab : {201088L, 1001L}) {
    const auto start = std::chrono::steady_clock::now();
    constexpr int64_t kEdgeRows = 5;
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> logits(static_cast<std::size_t>(kEdgeRows * vocab));
    std::uniform_real_distribution<float> narrow(-0.4f, 0.4f);
    for (int64_t t = 0; t < vocab; ++t) {
      logits[0 * vocab + t] = -inf;
      logits[1 * vocab + t] = 1.5f;
      logits[2 * vocab + t] = t % 2 ? narrow(harness.inputs().rng()) : -inf;
      logits[3 * vocab + t] = 10.0f - 0.25f * static_cast<float>(t % 64);
      logits[4 * vocab + t] = t == 5 || t == 77 || t == vocab - 1 ? static_cast<float>(t % 3) : -inf;
    }
    std::vector<SampleRow> rows;
    std::vector<const char*> row_mode;
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (const SampleMode& m : edge_modes) {
      for (int64_t r = 0; r < kEdgeRows; ++r) {
        SampleRow row = m.settings;
        if (row.top_k < 0) row.top_k = static_cast<int32_t>(vocab - 1);
        row.logit_row = static_cast<int32_t>(r);
        row.uniform = uniform(harness.inputs().rng());
        // The reference's logprobs of a row without a finite logit are NaN: that row asks for none.
        row.num_logprobs = r == 0 ? -1 : 5;
        rows.push_back(row);
        row_mode.push_back(m.name);
      }
    }
    check_sample(harness, logits, kEdgeRows, vocab, rows, row_mode,
                 fmt::format("edges V {} ({} rows, {} modes)", vocab, rows.size(), edge_modes.size()), start);
    // The flat, narrow and level-edge rows under the cutting modes again, few enough rows for the CUDA backend to
    // split each over a cluster of blocks.
    std::vector<SampleRow> few_rows;
    std::vector<const char*> few_mode;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const int32_t r = rows[i].logit_row;
      if ((r >= 1 && r <= 3) && (rows[i].top_k > 0 || rows[i].top_p < 1.0f)) {
        few_rows.push_back(rows[i]);
        few_mode.push_back(row_mode[i]);
      }
    }
    check_sample(harness, logits, kEdgeRows, vocab, few_rows, few_mode,
                 fmt::format("edges V {}, flat rows ({} rows)", vocab, few_rows.size()), start);
  }
}

// ---- FP8 block-128 weights (MODEL_FORMAT.md section 5 "fp8"; the CUDA paths of backend/cuda/quant/fp8.h) ----
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
    const QuantizedWeight& q = quantized_.emplace_back(quantize_weight(QuantScheme::Fp8Block, values, out, in));
    const std::vector<float>& exact = exact_.emplace_back(dequantize_weight(q.view()));
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
    w.device.weight = harness_.device().load_weight(view(DType::F8_E4M3, {out, in}, q.codes.data(), q.codes.size()));
    w.device.scale =
        harness_.device().load_weight(view(DType::F32, {scale_rows, scale_cols}, q.scales.data(), q.scales.size()));
    w.reference = harness_.reference().load_weight(view(DType::F32, {out, in}, exact.data(), exact.size() * 4));
    return w;
  }

 private:
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

void test_fp8_linear(Harness& harness) {
  struct Case {
    int64_t in, out;
    std::vector<int64_t> rows;
    const char* what;
  };
  std::vector<Case> cases{{5120, 6144, {1, 2, 3, 8, 16, 64, 300}, "q"},
                          {6144, 5120, {1, 5, 130}, "o"},
                          {2560, 5120, {2, 33}, "down"},
                          {336, 77, {1, 2, 3, 9, 200}, "odd: in not a multiple of 128, out not of 64"}};
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
  std::vector<Case> cases{{5120, 2560, {1, 2, 7, 64}}, {336, 208, {1, 5, 70}}};
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
       {0, 1, 63, 64, 65, 127, 128, 129, 300, 323}}};
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
    const std::vector<float> h = harness.inputs().uniform(c.rows * c.hidden);
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

void test_fp8(Harness& harness) {
  test_fp8_quantize(harness);
  test_fp8_linear(harness);
  test_fp8_lm_head(harness);
  test_fp8_swiglu(harness);
  test_fp8_moe(harness);
}

void run(const Options& options) {
  std::unique_ptr<Backend> device = create_backend(options.device);
  device->set_compute_dtype(parse_compute_dtype(options.dtype, device->device()));
  std::unique_ptr<Backend> reference = create_backend(options.reference);
  Harness harness(*device, *reference, options);
  spdlog::info("test-backend-ops: {} (--dtype {}) against {} (seed {})", device->name(), options.dtype,
               reference->name(), options.seed);
  const std::vector<std::pair<const char*, void (*)(Harness&)>> groups{
      {"place_tokens", test_place_tokens}, {"embedding", test_embedding}, {"rms_norm", test_norms},         {"linear", test_linear},
      {"linear_rows", test_linear_rows}, {"linear_many", test_linear_many}, {"rope", test_rope_ssmax},
      {"attention", test_attention},   {"route", test_route},            {"moe", test_moe},
      {"swiglu", test_swiglu},         {"lm_head", test_lm_head},        {"sample", test_sample},
      {"fp8", test_fp8}};
  for (const auto& [name, body] : groups)
    if (harness.wanted(name)) body(harness);
  harness.print_table();
  require(harness.failures() == 0, "test-backend-ops: {} case(s) failed", harness.failures());
}

const CommandRegistration registration([](CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* command = app.add_subcommand(
      "test-backend-ops",
      "Check every op of a backend against the reference backend on random inputs (Beam-1.0 shapes, odd sizes, "
      "window and block boundaries); prints a results table, exits 1 on any failure");
  command->add_option("--device", options->device, "backend under test")->capture_default_str();
  command->add_option("--reference", options->reference, "reference backend")->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random inputs")->capture_default_str();
  command->add_option("--filter", options->filter,
                      "only the op groups whose name contains this, or one of a comma-separated list (place_tokens, embedding, "
                      "rms_norm, linear, linear_rows, linear_many, rope, attention, route, moe, swiglu, lm_head, sample, fp8)");
  command
      ->add_option("--dtype", options->dtype,
                   "compute dtype of the backend under test (float32: FP32-accurate tolerances; bfloat16: BF16 ones)")
      ->capture_default_str();
  command->add_flag("--small", options->small_only, "skip the Beam-1.0-sized cases (quick runs on a CPU)");
  command->callback([options] { run(*options); });
});

}  // namespace
}  // namespace beamline::cli

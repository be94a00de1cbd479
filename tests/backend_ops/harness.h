#pragma once
// Test mode of backend_ops: every op of one backend (default cuda) against the reference backend (cpu) on fresh
// random inputs at Beam-1.0's real shapes, odd sizes and window/block boundaries (llama.cpp test-backend-ops
// discipline). Outputs start as NaN so unwritten elements fail; NaN never passes; the error is
// ‖out − ref‖ / ‖ref‖ against a tolerance set by the precision. The cases live in one file per op family
// (op_families.h); the Harness holds the two backends, the inputs and the results table.
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace beamline::backend_ops {

constexpr double kF32Tolerance = 1e-5;
// BF16/F16 weights times F32 activations: the CUDA GEMMs split each activation into 16-bit operands that sum to it,
// so their error is FP32 summation's (measured up to 7e-5 with K = 20480 on the tensor cores, whose FP32
// accumulation is not IEEE, with two terms), not a BF16 rounding's (2^-9: it would pass 1e-2 and fails the
// whole-model comparison).
constexpr double kSplitOperandTolerance = 2e-4;
// The same on the low-bit inputs (Inputs::low_bit_pairs with pair_sign weights), whose products and partial sums
// are exact in FP32 in any order: the split's three terms carry every bit, so only the SwiGLU's F32 functions and
// the accumulation of non-cancelling sums differ from the reference; two terms (17 bits) err by ~1e-3 there.
constexpr double kLowBitsTolerance = 1e-6;
// The widest row of low-bit pairs whose partial sums stay exact: multiples of 2^-18 below 2^6.
constexpr int64_t kLowBitsMaxWidth = 32;
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

struct TestOptions {
  std::string device = "cuda", reference = "cpu", filter, dtype = "float32";
  uint64_t seed = 0;
  bool small_only = false;
  bool batch_invariant = false;  // the backend under test in batch-invariant mode (Backend::set_batch_invariant)
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

  std::vector<float> uniform(int64_t n, float scale = 1.0f);
  // [rows, n] activations (n even, <= kLowBitsMaxWidth) whose pairs share their high bits: x[2i] = b + d and
  // x[2i + 1] = b + d', b an 8-bit value in [1, 2) (exact in BF16), d and d' multiples of 2^-18 under 2^-9: 19
  // significant bits, which hi + lo (about 17) cannot carry and hi + lo + lo2 can.
  std::vector<float> low_bit_pairs(int64_t rows, int64_t n);
  // BF16 weights [out, n] with w[o, 2i] = -w[o, 2i + 1] = ±1: against low_bit_pairs, x · w = Σ ±(d − d'), the high
  // bits cancelling exactly, every partial sum exact in FP32 in any order.
  TensorView pair_sign_weight(int64_t out, int64_t n);
  // Stored bytes of a random tensor of `dtype` (F32, BF16 or F16), kept alive by this object.
  TensorView weight(DType dtype, std::vector<int64_t> shape, float scale);
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::vector<std::vector<std::byte>> storage_;
};

// A tensor's values as F32 on the host (F32, I32 and BF16 tensors).
std::vector<float> as_f32(Backend& backend, const Tensor& tensor);
// ‖out − ref‖ / ‖ref‖, infinite when either holds a NaN (poison left in place or a NaN computed).
double relative_error(const std::vector<float>& out, const std::vector<float>& ref);

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The two backends and the running table.
class Harness {
 public:
  Harness(Backend& device, Backend& reference, const TestOptions& options)
      : device_(device), reference_(reference), options_(options), inputs_(options.seed) {}

  Inputs& inputs() { return inputs_; }
  Backend& device() { return device_; }
  Backend& reference() { return reference_; }
  bool small_only() const { return options_.small_only; }
  // --filter is a comma-separated list; an op group runs when its name contains any entry.
  bool wanted(std::string_view op) const;
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
  Pair poisoned(DType dtype, std::vector<int64_t> shape);

  // Records the device's output against the reference's (relative error within `tolerance`).
  void record(std::string op, std::string shape, const Pair& out, double tolerance, double seconds,
              std::string note = {});
  // Records a result the case judged itself (exact ids, bit-for-bit codes, counts of wrong elements).
  void record_result(Result result);

  int failures() const;
  // The Markdown table of every result and the line "N cases, M failed" that the GPU scripts read.
  void print_table() const;

 private:
  Backend& device_;
  Backend& reference_;
  const TestOptions& options_;
  Inputs inputs_;
  std::vector<Result> results_;
};

// A stack of `experts` random BF16 SwiGLU experts (fan-in scaled) on both backends, prepared for the moe ops; the
// first `distinct` drawn and reused cyclically (a prime, for Beam-sized stacks: host memory stays bounded and
// neighbouring experts still differ, so a wrong expert index shows).
struct ExpertPair {
  MoeTensors device, reference;
};
ExpertPair random_experts(Harness& harness, int32_t experts, int32_t distinct, int64_t hidden, int64_t intermediate,
                          DType dtype = DType::BF16);
// The same with pair_sign_weight gate and up matrices (hidden <= kLowBitsMaxWidth), for low_bit_pairs tokens.
ExpertPair low_bit_experts(Harness& harness, int32_t experts, int64_t hidden, int64_t intermediate);

// Routings of MoE cases (the moe and fp8 families). Expert ids of `rows` tokens: top_k distinct experts each, in
// random order; weights positive.
std::pair<std::vector<int32_t>, std::vector<float>> random_assignment(Inputs& inputs, int64_t rows, int32_t experts,
                                                                      int32_t top_k);
// Expert ids of `rows` tokens giving expert e exactly counts[e] slots (each at most `rows`, rows * top_k in all).
std::vector<int32_t> assignment_with_counts(Inputs& inputs, const std::vector<int32_t>& counts, int64_t rows,
                                            int32_t top_k);
// Slot counts per expert, zero but for the (expert, slots) pairs given.
std::vector<int32_t> sparse_counts(int32_t experts, const std::vector<std::pair<int32_t, int32_t>>& slots);

}  // namespace beamline::backend_ops

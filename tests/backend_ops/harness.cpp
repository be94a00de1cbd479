#include "harness.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "util/error.h"

namespace beamline::backend_ops {

std::vector<float> Inputs::uniform(int64_t n, float scale) {
  std::uniform_real_distribution<float> distribution(-scale, scale);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = distribution(rng_);
  return values;
}

TensorView Inputs::weight(DType dtype, std::vector<int64_t> shape, float scale) {
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

std::vector<float> Inputs::low_bit_pairs(int64_t rows, int64_t n) {
  require(n % 2 == 0 && n <= kLowBitsMaxWidth, "backend_ops: low-bit rows of width {} (even, <= {})", n,
          kLowBitsMaxWidth);
  std::uniform_int_distribution<int> high(128, 255), low(-511, 511);  // b = high / 128, d = low / 2^18
  std::vector<float> values(static_cast<std::size_t>(rows * n));
  for (std::size_t i = 0; i < values.size(); i += 2) {
    const float b = std::ldexp(static_cast<float>(high(rng_)), -7);
    values[i] = b + std::ldexp(static_cast<float>(low(rng_)), -18);
    values[i + 1] = b + std::ldexp(static_cast<float>(low(rng_)), -18);
  }
  return values;
}

TensorView Inputs::pair_sign_weight(int64_t out, int64_t n) {
  require(n % 2 == 0 && n <= kLowBitsMaxWidth, "backend_ops: pair-sign weight of width {} (even, <= {})", n,
          kLowBitsMaxWidth);
  TensorView view;
  view.name = fmt::format("pair signs [{}, {}]", out, n);
  view.dtype = DType::BF16;
  view.shape = {out, n};
  auto& bytes = storage_.emplace_back(static_cast<std::size_t>(out * n) * sizeof(uint16_t));
  auto* bits = reinterpret_cast<uint16_t*>(bytes.data());
  std::bernoulli_distribution negative(0.5);
  for (int64_t i = 0; i < out * n; i += 2) {
    const float sign = negative(rng_) ? -1.0f : 1.0f;
    bits[i] = f32_to_bf16(sign);
    bits[i + 1] = f32_to_bf16(-sign);
  }
  view.data = bytes.data();
  view.nbytes = bytes.size();
  return view;
}

std::vector<float> as_f32(Backend& backend, const Tensor& tensor) {
  if (tensor.dtype() == DType::F32) return backend.download_f32(tensor);
  std::vector<float> values(static_cast<std::size_t>(tensor.numel()));
  if (tensor.dtype() == DType::I32) {
    const std::vector<int32_t> ints = backend.download_i32(tensor);
    std::copy(ints.begin(), ints.end(), values.begin());
    return values;
  }
  require(tensor.dtype() == DType::BF16, "backend_ops: cannot compare {} tensors", dtype_name(tensor.dtype()));
  std::vector<uint16_t> bits(values.size());
  backend.download(tensor, bits.data());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_f32(bits[i]);
  return values;
}

double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  require(out.size() == ref.size(), "backend_ops: {} values against {}", out.size(), ref.size());
  double difference = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i]) || std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(out[i]) - ref[i];
    difference += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm > 0.0 ? std::sqrt(difference / norm) : std::sqrt(difference);
}

bool Harness::wanted(std::string_view op) const {
  if (options_.filter.empty()) return true;
  std::string_view rest = options_.filter;
  for (;;) {
    const std::size_t comma = rest.find(',');
    if (op.find(rest.substr(0, comma)) != op.npos) return true;
    if (comma == rest.npos) return false;
    rest.remove_prefix(comma + 1);
  }
}

Harness::Pair Harness::poisoned(DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (dtype == DType::I32) return i32(std::vector<int32_t>(static_cast<std::size_t>(n), -1), shape);
  return f32(std::vector<float>(static_cast<std::size_t>(n), std::numeric_limits<float>::quiet_NaN()), shape);
}

void Harness::record(std::string op, std::string shape, const Pair& out, double tolerance, double seconds,
                     std::string note) {
  Result result{std::move(op), std::move(shape), 0.0, tolerance, std::move(note), false, seconds};
  result.error = relative_error(as_f32(device_, out.device), as_f32(reference_, out.reference));
  result.passed = result.error <= tolerance;
  record_result(std::move(result));
}

void Harness::record_result(Result result) {
  const Result& r = result;
  spdlog::info("{:<16} {:<52} error {:<10.3g} tol {:.0e}  {} ({:.2f} s){}", r.op, r.shape, r.error, r.tolerance,
               r.passed ? "pass" : "FAIL", r.seconds, r.note.empty() ? "" : "  " + r.note);
  results_.push_back(std::move(result));
}

int Harness::failures() const {
  return static_cast<int>(std::count_if(results_.begin(), results_.end(), [](const Result& r) { return !r.passed; }));
}

void Harness::print_table() const {
  std::printf("\n| op | shape | error | tolerance | result | note |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const Result& r : results_)
    std::printf("| %s | %s | %.3g | %.0e | %s | %s |\n", r.op.c_str(), r.shape.c_str(), r.error, r.tolerance,
                r.passed ? "pass" : "**FAIL**", r.note.c_str());
  std::printf("\n%zu cases, %d failed\n", results_.size(), failures());
}

ExpertPair random_experts(Harness& harness, int32_t experts, int32_t distinct, int64_t hidden, int64_t intermediate,
                          DType dtype) {
  std::vector<Harness::Pair> gate, up, down;
  for (int32_t e = 0; e < distinct; ++e) {
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
    gate.push_back(harness.random_weight(dtype, {intermediate, hidden}, in_scale));
    up.push_back(harness.random_weight(dtype, {intermediate, hidden}, in_scale));
    down.push_back(
        harness.random_weight(dtype, {hidden, intermediate}, 1.0f / std::sqrt(static_cast<float>(intermediate))));
  }
  ExpertPair pair;
  for (int32_t e = 0; e < experts; ++e) {
    const auto i = static_cast<std::size_t>(e % distinct);
    pair.device.experts.push_back({{gate[i].device, {}, {}}, {up[i].device, {}, {}}, {down[i].device, {}, {}}});
    pair.reference.experts.push_back(
        {{gate[i].reference, {}, {}}, {up[i].reference, {}, {}}, {down[i].reference, {}, {}}});
  }
  harness.device().prepare_moe(pair.device);
  harness.reference().prepare_moe(pair.reference);
  return pair;
}

ExpertPair low_bit_experts(Harness& harness, int32_t experts, int64_t hidden, int64_t intermediate) {
  ExpertPair pair;
  for (int32_t e = 0; e < experts; ++e) {
    auto gate = harness.weight(harness.inputs().pair_sign_weight(intermediate, hidden));
    auto up = harness.weight(harness.inputs().pair_sign_weight(intermediate, hidden));
    auto down = harness.random_weight(DType::BF16, {hidden, intermediate},
                                      1.0f / std::sqrt(static_cast<float>(intermediate)));
    pair.device.experts.push_back({{gate.device, {}, {}}, {up.device, {}, {}}, {down.device, {}, {}}});
    pair.reference.experts.push_back({{gate.reference, {}, {}}, {up.reference, {}, {}}, {down.reference, {}, {}}});
  }
  harness.device().prepare_moe(pair.device);
  harness.reference().prepare_moe(pair.reference);
  return pair;
}

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

// The experts laid out in order and slot (t, j) taking entry j * rows + t, so no token meets an expert twice; each
// token's j order is then shuffled.
std::vector<int32_t> assignment_with_counts(Inputs& inputs, const std::vector<int32_t>& counts, int64_t rows,
                                            int32_t top_k) {
  std::vector<int32_t> layout;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    require(counts[e] <= rows, "backend_ops: moe case gives expert {} {} of {} tokens", e, counts[e], rows);
    layout.insert(layout.end(), static_cast<std::size_t>(counts[e]), static_cast<int32_t>(e));
  }
  require(static_cast<int64_t>(layout.size()) == rows * top_k, "backend_ops: moe case counts sum to {}, not {}",
          layout.size(), rows * top_k);
  std::vector<int32_t> ids(layout.size());
  for (int64_t t = 0; t < rows; ++t)
    for (int32_t j = 0; j < top_k; ++j)
      ids[static_cast<std::size_t>(t * top_k + j)] = layout[static_cast<std::size_t>(j * rows + t)];
  for (int64_t t = 0; t < rows; ++t)
    std::shuffle(ids.begin() + t * top_k, ids.begin() + (t + 1) * top_k, inputs.rng());
  return ids;
}

std::vector<int32_t> sparse_counts(int32_t experts, const std::vector<std::pair<int32_t, int32_t>>& slots) {
  std::vector<int32_t> counts(static_cast<std::size_t>(experts), 0);
  for (const auto& [expert, count] : slots) counts[static_cast<std::size_t>(expert)] = count;
  return counts;
}

}  // namespace beamline::backend_ops

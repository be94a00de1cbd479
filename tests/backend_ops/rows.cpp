// Row-wise ops in test mode: place_tokens and the queued read-back, embedding, RMSNorm (plain and with the
// residual add), RoPE and the SSMax query scale.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <tuple>
#include <utility>

#include "harness.h"
#include "op_families.h"

namespace beamline::backend_ops {

void test_embedding(Harness& harness) {
  for (auto [vocab, hidden, dtype] : {std::tuple{997L, 5120L, DType::BF16}, {1000L, 67L, DType::F32}, {50L, 9000L, DType::BF16}}) {
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
  for (auto [rows, hidden] : {std::pair{1L, 5120L}, {64L, 5120L}, {7L, 1000L}, {3L, 64L}, {2L, 9000L}}) {
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

    auto next_weight = harness.random_weight(DType::BF16, {hidden}, 1.0f);
    auto normed = harness.poisoned(DType::F32, {rows, hidden});
    harness.device().add_rms_norm_then_norm(residual.device, x.device, weight.device, 1e-6f, 0.098f,
                                            next_weight.device, normed.device);
    harness.reference().add_rms_norm_then_norm(residual.reference, x.reference, weight.reference, 1e-6f, 0.098f,
                                               next_weight.reference, normed.reference);
    harness.record("add_rms_norm_then_norm", fmt::format("T {} H {} residual", rows, hidden), residual, kF32Tolerance,
                   seconds_since(start));
    harness.record("add_rms_norm_then_norm", fmt::format("T {} H {} next norm", rows, hidden), normed, kF32Tolerance,
                   seconds_since(start));
  }
}

void test_rope_ssmax(Harness& harness) {
  for (auto [heads, dim] : {std::pair{48, 128}, {8, 128}, {3, 16}, {80, 128}}) {
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
    // q and k in one op (one launch on cuda), k with its own head count.
    const int32_t kv_heads = std::max(1, heads / 8);
    auto q = harness.f32(harness.inputs().uniform(rows * heads * dim), {rows, int64_t{heads} * dim});
    auto k = harness.f32(harness.inputs().uniform(rows * kv_heads * dim), {rows, int64_t{kv_heads} * dim});
    harness.device().rope_qk(q.device, k.device, pos.device, heads, kv_heads, dim, 10000.0f);
    harness.reference().rope_qk(q.reference, k.reference, pos.reference, heads, kv_heads, dim, 10000.0f);
    harness.record("rope_qk", fmt::format("T {} q {}x{} positions to 1e6", rows, heads, dim), q, kF32Tolerance,
                   seconds_since(start));
    harness.record("rope_qk", fmt::format("T {} k {}x{} positions to 1e6", rows, kv_heads, dim), k, kF32Tolerance,
                   seconds_since(start));
    harness.device().ssmax_scale(x.device, pos.device, 2048.0f, 0.1f);
    harness.reference().ssmax_scale(x.reference, pos.reference, 2048.0f, 0.1f);
    harness.record("ssmax_scale", fmt::format("T {} width {}", rows, heads * dim), x, kF32Tolerance,
                   seconds_since(start));
  }
}

}  // namespace beamline::backend_ops

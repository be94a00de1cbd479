// Paged attention in both modes. Test: write_kv, then paged_attention over a shared random pool with shuffled
// block tables, for decode, varlen and chunked prefill, windows, block sizes, GQA groups and the split, tile and
// window edges of the CUDA kernels, in both compute dtypes, FP8 pools with per-tensor KV scales; a missing block must
// poison its rows; amax_scale (the scales of --calculate-kv-scales). Perf (`perf
// attention`): paged attention on the CUDA backend at Beam-1.0's shapes (48 query heads, 8 kv heads x 128, block
// size 16) over a random BF16 KV pool drawn on the device: decode batches (global, 8K to 1M keys, and sliding window)
// and prefill (--graph: each sample one CUDA graph of its calls, as the decode step runs them),
// each next to its floor (KV bytes / 4.8 TB/s for decode, FLOPs / 758 TFLOP/s for prefill, PERF.md). --dtype picks
// the backend's compute dtype (the prefill kernel's tensor-core operands: float32 = hi, lo and lo2 BF16 terms,
// bfloat16 = one rounding). Prints a Markdown table; bench/torch_attention_peers.py prints the same for PyTorch.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "op_families.h"
#include "perf.h"
#include "kv/kv_cache_layout.h"
#include "quant/element_codes.h"

namespace beamline::backend_ops {
namespace {

// write_kv then paged_attention over a shared random pool: sequences given as (cached positions, new tokens).
struct AttentionCase {
  std::string what;
  int32_t heads, kv_heads, dim, block_size, window;
  DType kv_dtype;
  std::vector<std::pair<int32_t, int32_t>> sequences;
  // >= 0: that sequence's first block is given back although its queries need it; the device must write NaN
  // for its rows (backend/cuda/attention/attention.h) and finite values elsewhere, and there is no reference (the CPU backend throws).
  int32_t drop_sequence = -1;
  // K and V (pool and new rows) are uniform times this, q uniform over it (scores stay O(1)).
  float magnitude = 1.0f;
  // FP8 pools: per-tensor scales (vLLM's k_scale = max|k| / 200, v_scale = max|v| / 100 of all the K and V), else 1.0.
  bool kv_scales = false;
};

AttentionParams attention_params(int32_t heads, int32_t kv_heads, int32_t dim, int32_t window, int32_t slot) {
  AttentionParams params;
  params.num_heads = heads;
  params.num_kv_heads = kv_heads;
  params.head_dim = dim;
  params.scale = 1.0f / std::sqrt(static_cast<float>(dim));
  params.sliding_window = window;
  params.slot = slot;
  return params;
}

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
  // --kv-cache-dtype fp8: E4M3 codes of value / scale.
  auto pool_tensor = [&](Backend& backend, const std::vector<float>& values, float scale) {
    if (c.kv_dtype == DType::F32) return backend.upload_f32(values, pool_shape);
    if (c.kv_dtype == DType::F8_E4M3) {
      std::vector<uint8_t> codes(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) codes[i] = f32_to_e4m3(values[i] / scale);
      return backend.upload(codes.data(), DType::F8_E4M3, pool_shape);
    }
    std::vector<uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
    return backend.upload(bits.data(), DType::BF16, pool_shape);
  };
  const int64_t kv_width = int64_t{c.kv_heads} * c.dim, q_width = int64_t{c.heads} * c.dim;
  const std::vector<float> k_pool = harness.inputs().uniform(pool_elements, c.magnitude);
  const std::vector<float> v_pool = harness.inputs().uniform(pool_elements, c.magnitude);
  const std::vector<float> k_rows = harness.inputs().uniform(rows * kv_width, c.magnitude);
  const std::vector<float> v_rows = harness.inputs().uniform(rows * kv_width, c.magnitude);
  auto amax = [](const std::vector<float>& a, const std::vector<float>& b) {
    float result = 0.0f;
    for (const auto* values : {&a, &b})
      for (float value : *values) result = std::max(result, std::abs(value));
    return result;
  };
  const float k_scale = c.kv_scales ? amax(k_pool, k_rows) / 200.0f : 1.0f;
  const float v_scale = c.kv_scales ? amax(v_pool, v_rows) / 100.0f : 1.0f;
  PagedKvPool device_pool{pool_tensor(harness.device(), k_pool, k_scale),
                          pool_tensor(harness.device(), v_pool, v_scale)};
  PagedKvPool reference_pool{pool_tensor(harness.reference(), k_pool, k_scale),
                             pool_tensor(harness.reference(), v_pool, v_scale)};
  if (c.kv_scales) {
    auto scales = harness.f32({k_scale, v_scale}, {2});
    device_pool.scales = scales.device;
    reference_pool.scales = scales.reference;
  }
  auto block_table = harness.i32(table, {sequences, width});
  const AttentionBatch device_batch = harness.device().make_attention_batch(positions, query_start, seq_lens);
  const AttentionBatch reference_batch = harness.reference().make_attention_batch(positions, query_start, seq_lens);
  auto k = harness.f32(k_rows, {rows, kv_width});
  auto v = harness.f32(v_rows, {rows, kv_width});
  auto q = harness.f32(harness.inputs().uniform(rows * q_width, 1.0f / c.magnitude), {rows, q_width});
  std::string shape = fmt::format("{} q{}/kv{}x{} bs {} win {} {}", c.what, c.heads, c.kv_heads, c.dim, c.block_size,
                                  c.window, dtype_name(c.kv_dtype));
  if (c.kv_scales) shape += fmt::format(" x{} scales {:.3g}/{:.3g}", c.magnitude, k_scale, v_scale);

  const AttentionParams params = attention_params(c.heads, c.kv_heads, c.dim, c.window, slot);
  auto out = harness.poisoned(DType::F32, {rows, q_width});
  // write_kv right before paged_attention, as in a decode step (what the kernel launched early, query-rows-pdl, must
  // wait for); the codes are checked after.
  harness.device().write_kv(k.device, v.device, device_pool, slot, block_table.device, device_batch);
  harness.reference().write_kv(k.reference, v.reference, reference_pool, slot, block_table.reference, reference_batch);
  const ComputeDType harness_dtype = harness.device().compute_dtype();
  harness.device().set_compute_dtype(compute);
  harness.device().paged_attention(q.device, device_pool, block_table.device, device_batch, params, out.device);
  harness.device().set_compute_dtype(harness_dtype);
  if (c.kv_dtype == DType::F8_E4M3) {
    // The codes bit for bit: both round to nearest even and saturate at ±448.
    int64_t mismatches = 0;
    for (auto [device, reference] : {std::pair{&device_pool.k, &reference_pool.k}, {&device_pool.v, &reference_pool.v}}) {
      std::vector<uint8_t> got(static_cast<std::size_t>(pool_elements)), want(got.size());
      harness.device().download(*device, got.data());
      harness.reference().download(*reference, want.data());
      for (std::size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i] ? 1 : 0;
    }
    harness.record_result({"write_kv", shape, static_cast<double>(mismatches), 0.0,
                           fmt::format("K and V E4M3 codes bit for bit: {} mismatches", mismatches), mismatches == 0,
                           seconds_since(start)});
  } else {
    harness.record("write_kv", shape, {device_pool.k, reference_pool.k}, 0.0, seconds_since(start), "K pool, exact");
    harness.record("write_kv", shape, {device_pool.v, reference_pool.v}, 0.0, seconds_since(start), "V pool, exact");
  }

  const bool bf16 = compute == ComputeDType::BFloat16;
  if (c.drop_sequence >= 0) {
    record_missing_block(harness, bf16 ? shape + " compute bf16" : shape, out.device, query_start, c.drop_sequence,
                         seconds_since(start));
    return;
  }
  harness.reference().paged_attention(q.reference, reference_pool, block_table.reference, reference_batch, params,
                                      out.reference);
  // Float32 prefill tiles sum a query row's keys in one pass, in another order than the reference, so their
  // difference grows with the keys: 5.96e-6 after 4,396 and 1.10e-5 after 9,216 on the H200 (2026-12-03, the FP8
  // shadow's tiles). Decode rows split long sequences into short partial sums and keep the plain tolerance.
  int32_t longest_prefill = 0;
  for (std::size_t s = 0; s < c.sequences.size(); ++s)
    if (c.sequences[s].second > 1) longest_prefill = std::max(longest_prefill, seq_lens[s]);
  const double f32_tolerance = kF32Tolerance * std::max(1.0, longest_prefill / 4096.0);
  harness.record("paged_attention", shape, out, bf16 ? kBf16OperandTolerance : f32_tolerance, seconds_since(start),
                 bf16 ? "compute bfloat16" : "");
}

// amax_scale on the device against the reference: the same F32 scale bit for bit (a max is exact, and both divide
// once, IEEE).
void test_amax_scale_case(Harness& harness, const std::string& what, const std::vector<float>& values, float divisor) {
  const auto start = std::chrono::steady_clock::now();
  auto x = harness.f32(values, {static_cast<int64_t>(values.size())});
  auto out = harness.poisoned(DType::F32, {3});
  Tensor device_out = out.device.view(1, {1}), reference_out = out.reference.view(1, {1});
  harness.device().amax_scale(x.device, divisor, device_out);
  harness.reference().amax_scale(x.reference, divisor, reference_out);
  const float got = harness.device().download_f32(out.device)[1];
  const float want = harness.reference().download_f32(out.reference)[1];
  harness.record_result({"amax_scale", fmt::format("{} n={} / {}", what, values.size(), divisor),
                         std::abs(static_cast<double>(got) - want), 0.0,
                         fmt::format("device {} reference {}, bit for bit", got, want),
                         std::memcmp(&got, &want, sizeof(float)) == 0, seconds_since(start)});
}

}  // namespace

void test_amax_scale(Harness& harness) {
  Inputs& inputs = harness.inputs();
  test_amax_scale_case(harness, "one element", {-3.5f}, 200.0f);
  test_amax_scale_case(harness, "odd size", inputs.uniform(12345, 7.0f), 200.0f);
  test_amax_scale_case(harness, "x1024, a decode step's k", inputs.uniform(8 * 128, 1024.0f), 200.0f);
  test_amax_scale_case(harness, "x1/1024, a prefill's v", inputs.uniform(2048 * 1024, 1.0f / 1024), 100.0f);
  std::vector<float> spike = inputs.uniform(100003, 1.0f);
  spike[77777] = -9000.0f;  // the maximum in the middle of a block's range, negative
  test_amax_scale_case(harness, "one spike", spike, 200.0f);
  std::vector<float> with_nan = inputs.uniform(5000, 2.0f);
  with_nan[10] = with_nan[4321] = std::numeric_limits<float>::quiet_NaN();
  test_amax_scale_case(harness, "NaN skipped", with_nan, 100.0f);
  test_amax_scale_case(harness, "all zero -> 1.0", std::vector<float>(4096, 0.0f), 200.0f);
  if (!harness.small_only())
    test_amax_scale_case(harness, "8K tokens x 1024", inputs.uniform(int64_t{8192} * 1024, 300.0f), 200.0f);
}

namespace {

std::vector<AttentionCase> attention_cases(Harness& harness) {
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
      // FP8 KV cache (E4M3, scale 1.0): the device reads the same codes exactly, so FP32's tolerance.
      {"fp8 kv decode", 48, 8, 128, 16, 0, DType::F8_E4M3, {{600, 1}, {15, 1}, {16, 1}}},
      {"fp8 kv mixed, window", 48, 8, 128, 16, 512, DType::F8_E4M3, {{530, 70}, {0, 129}, {900, 1}}},
      {"fp8 kv odd dims", 6, 3, 40, 4, 5, DType::F8_E4M3, {{3, 11}, {0, 2}}},
      // The tensor-core decode kernel on E4M3 pools (F16 operands): block sizes, windows, groups 1-8, 2-4 rows.
      {"fp8 kv decode bs 8 window", 48, 8, 128, 8, 30, DType::F8_E4M3, {{300, 1}, {29, 3}}},
      {"fp8 kv decode bs 64 GQA 64/8", 64, 8, 128, 64, 0, DType::F8_E4M3, {{1500, 1}, {64, 1}, {63, 4}}},
      {"fp8 kv decode GQA 14/2", 14, 2, 128, 16, 0, DType::F8_E4M3, {{777, 1}, {12, 2}}},
      {"fp8 kv decode GQA 8/8", 8, 8, 128, 16, 0, DType::F8_E4M3, {{1024, 1}, {3, 1}}},
      {"fp8 kv missing block, decode", 48, 8, 128, 16, 0, DType::F8_E4M3, {{3000, 1}, {5000, 1}, {40, 1}}, 1},
      // The per-tile copies (attention/decode.cu): tiles cut by the range or a window take the per-row path, blocks of
      // < 16 positions always; interior tiles of one block the per-tile one; a given-back block either way.
      {"fp8 kv decode tile edges", 48, 8, 128, 16, 0, DType::F8_E4M3,
       {{14, 1}, {15, 1}, {16, 1}, {17, 1}, {31, 1}, {47, 2}, {63, 4}, {1, 1}}},
      {"fp8 kv decode 1 row 8K", 48, 8, 128, 16, 0, DType::F8_E4M3, {{8191, 1}}},
      {"fp8 kv decode window 512 edges", 48, 8, 128, 16, 512, DType::F8_E4M3, {{527, 1}, {528, 1}, {529, 1}, {1000, 4}}},
      {"fp8 kv decode bs 4", 48, 8, 128, 4, 0, DType::F8_E4M3, {{500, 1}, {37, 1}, {6, 2}}},
      {"fp8 kv decode GQA 32/8 bs 32 window", 32, 8, 128, 32, 512, DType::F8_E4M3, {{4000, 4}, {600, 1}}},
      {"fp8 kv missing block, 1 row", 48, 8, 128, 16, 0, DType::F8_E4M3, {{40, 1}, {6000, 1}}, 1},
      // Prefill tiles over E4M3 pools: the tensor-core prefill kernels over the BF16 shadow (attention/fp8_shadow.cu)
      // next to decode rows on the pool itself; tile edges, windows, block sizes, groups, a given-back block.
      {"fp8 kv prefill tile edges", 48, 8, 128, 16, 0, DType::F8_E4M3, {{0, 127}, {0, 129}, {64, 191}, {1, 22}}},
      {"fp8 kv chunked prefill long", 48, 8, 128, 16, 0, DType::F8_E4M3, {{2000, 150}, {31, 33}, {900, 1}}},
      {"fp8 kv prefill window 5", 48, 8, 128, 16, 5, DType::F8_E4M3, {{0, 200}, {300, 45}, {700, 2}}},
      {"fp8 kv prefill bs 64 GQA 64/8", 64, 8, 128, 64, 0, DType::F8_E4M3, {{3, 250}, {100, 2}}},
      {"fp8 kv prefill GQA 4/1", 4, 1, 128, 16, 0, DType::F8_E4M3, {{5, 200}}},
      {"fp8 kv missing block, prefill", 48, 8, 128, 16, 0, DType::F8_E4M3, {{40, 1}, {64, 70}, {20, 9}}, 1},
      {"fp8 kv chunk after 4K", 48, 8, 128, 16, 0, DType::F8_E4M3, {{4096, 300}, {5000, 1}}},
      // Per-tensor KV scales (vLLM's k_scale / v_scale) with K and V of magnitude 1024 and 1/1024: written as
      // e4m3(x / scale) bit for bit, read as code * scale by the decode kernel (q's scale and the output), the
      // generic kernel (mixed and odd shapes) and the CPU.
      {"fp8 kv scaled decode", 48, 8, 128, 16, 0, DType::F8_E4M3, {{600, 1}, {15, 1}, {16, 4}}, -1, 1024.0f, true},
      {"fp8 kv scaled decode", 48, 8, 128, 16, 0, DType::F8_E4M3, {{600, 1}, {15, 1}, {16, 4}}, -1, 1.0f / 1024, true},
      {"fp8 kv scaled decode window GQA 14/2", 14, 2, 128, 8, 30, DType::F8_E4M3, {{300, 1}, {29, 3}}, -1, 1024.0f,
       true},
      {"fp8 kv scaled mixed, window", 48, 8, 128, 16, 512, DType::F8_E4M3, {{530, 70}, {0, 129}, {900, 1}}, -1,
       1024.0f, true},
      {"fp8 kv scaled odd dims", 6, 3, 40, 4, 5, DType::F8_E4M3, {{3, 11}, {0, 2}}, -1, 1.0f / 1024, true},
  };
  if (!harness.small_only()) {
    cases.push_back({"decode 32K", 48, 8, 128, 16, 0, DType::BF16, {{32767, 1}, {20000, 1}}});
    cases.push_back({"decode 32K", 48, 8, 128, 16, 0, DType::F32, {{32767, 1}, {100, 1}}});
    cases.push_back({"fp8 kv decode 32K", 48, 8, 128, 16, 0, DType::F8_E4M3, {{32767, 1}, {20000, 1}}});
    cases.push_back(
        {"fp8 kv scaled decode 32K", 48, 8, 128, 16, 0, DType::F8_E4M3, {{32767, 1}, {20000, 1}}, -1, 1024.0f, true});
    cases.push_back({"prefill global 1K", 48, 8, 128, 16, 0, DType::BF16, {{0, 1024}}});
    cases.push_back({"prefill window 2K", 48, 8, 128, 16, 512, DType::BF16, {{0, 2048}}});
    cases.push_back({"fp8 kv chunk after 8K", 48, 8, 128, 16, 0, DType::F8_E4M3, {{8192, 1024}, {16000, 1}}});
    cases.push_back({"fp8 kv chunk after 8K window", 48, 8, 128, 16, 512, DType::F8_E4M3, {{8192, 1024}}});
    AttentionCase batch128{"decode B=128", 48, 8, 128, 16, 0, DType::BF16, {}};
    for (int i = 0; i < 128; ++i)
      batch128.sequences.emplace_back(static_cast<int32_t>(harness.inputs().rng()() % 3000), 1);
    cases.push_back(batch128);
  }
  return cases;
}

// The most query rows of a sequence that the CUDA split-KV decode kernel takes (cuda attention.h kDecodeMaxQueryRows).
constexpr int32_t kDecodeRows = 4;

void run_attention_cases(Harness& harness, const std::vector<AttentionCase>& cases) {
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

}  // namespace

void test_attention(Harness& harness) { run_attention_cases(harness, attention_cases(harness)); }

void test_kv_decode(Harness& harness) {
  std::vector<AttentionCase> cases = attention_cases(harness);
  std::erase_if(cases, [](const AttentionCase& c) {
    return c.kv_dtype != DType::F8_E4M3 ||
           std::any_of(c.sequences.begin(), c.sequences.end(), [](const auto& s) { return s.second > kDecodeRows; });
  });
  run_attention_cases(harness, cases);
}


namespace {

// block_attention over a random pool: S blocks of `block` rows, sequence s holding seq_lens[s] keys (its block the last
// `block`), block-row-major rows.
struct BlockAttentionCase {
  std::string what;
  int32_t heads, kv_heads, dim, pool_block_size, window, block;
  DType kv_dtype;
  std::vector<int32_t> seq_lens;
  // >= 0: that sequence's last block (which every one of its rows sees) is given back; the device must write NaN
  // for its rows and finite values elsewhere (no reference: the CPU backend throws).
  int32_t drop_sequence = -1;
};

void test_block_attention_case(Harness& harness, const BlockAttentionCase& c) {
  const auto start = std::chrono::steady_clock::now();
  const int32_t slots = 3, slot = 2;
  const auto sequences = static_cast<int64_t>(c.seq_lens.size());
  int32_t width = 1, total_blocks = 0;
  for (int32_t length : c.seq_lens) {
    width = std::max(width, (length + c.pool_block_size - 1) / c.pool_block_size);
    total_blocks += (length + c.pool_block_size - 1) / c.pool_block_size;
  }
  const int32_t pool_blocks = total_blocks + 2;
  std::vector<int32_t> order(static_cast<std::size_t>(pool_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), harness.inputs().rng());
  // Blocks wholly before the first row's window are given back: the op must not need them.
  std::vector<int32_t> table(static_cast<std::size_t>(sequences * width), -1);
  std::size_t next = 0;
  for (std::size_t s = 0; s < c.seq_lens.size(); ++s) {
    const int32_t length = c.seq_lens[s], blocks = (length + c.pool_block_size - 1) / c.pool_block_size;
    const auto first_visible = static_cast<int32_t>(first_visible_position(length - c.block, c.window));
    for (int32_t b = 0; b < blocks; ++b) {
      const int32_t block = order[next++];
      const bool dropped = static_cast<int32_t>(s) == c.drop_sequence && b == blocks - 1;
      if ((b + 1) * c.pool_block_size > first_visible && !dropped) table[s * static_cast<std::size_t>(width) + b] = block;
    }
  }
  const std::vector<int64_t> pool_shape{pool_blocks, slots, c.pool_block_size, c.kv_heads, c.dim};
  const int64_t pool_elements = int64_t{pool_blocks} * slots * c.pool_block_size * c.kv_heads * c.dim;
  auto pool_tensor = [&](Backend& backend, const std::vector<float>& values) {
    if (c.kv_dtype == DType::F32) return backend.upload_f32(values, pool_shape);
    if (c.kv_dtype == DType::F8_E4M3) {
      std::vector<uint8_t> codes(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) codes[i] = f32_to_e4m3(values[i]);
      return backend.upload(codes.data(), DType::F8_E4M3, pool_shape);
    }
    std::vector<uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
    return backend.upload(bits.data(), DType::BF16, pool_shape);
  };
  const std::vector<float> k_pool = harness.inputs().uniform(pool_elements, 1.0f);
  const std::vector<float> v_pool = harness.inputs().uniform(pool_elements, 1.0f);
  const PagedKvPool device_pool{pool_tensor(harness.device(), k_pool), pool_tensor(harness.device(), v_pool)};
  const PagedKvPool reference_pool{pool_tensor(harness.reference(), k_pool), pool_tensor(harness.reference(), v_pool)};
  auto block_table = harness.i32(table, {sequences, width});
  // One row per block, at its last position.
  std::vector<int32_t> positions, query_start{0};
  for (int32_t length : c.seq_lens) {
    positions.push_back(length - 1);
    query_start.push_back(query_start.back() + 1);
  }
  const AttentionBatch device_blocks = harness.device().make_attention_batch(positions, query_start, c.seq_lens);
  const AttentionBatch reference_blocks = harness.reference().make_attention_batch(positions, query_start, c.seq_lens);
  const int64_t rows = int64_t{c.block} * sequences, q_width = int64_t{c.heads} * c.dim;
  auto q = harness.f32(harness.inputs().uniform(rows * q_width, 1.0f), {rows, q_width});
  const AttentionParams params = attention_params(c.heads, c.kv_heads, c.dim, c.window, slot);
  auto out = harness.poisoned(DType::F32, {rows, q_width});
  const std::string shape = fmt::format("{} q{}/kv{}x{} bs {} win {} B {} S {} {}", c.what, c.heads, c.kv_heads, c.dim,
                                        c.pool_block_size, c.window, c.block, sequences, dtype_name(c.kv_dtype));
  harness.device().block_attention(q.device, device_pool, block_table.device, device_blocks, params, out.device);
  if (c.drop_sequence >= 0) {
    const std::vector<float> values = harness.device().download_f32(out.device);
    int64_t wrong = 0;
    for (int64_t row = 0; row < rows; ++row) {
      const bool poisoned = row % sequences == c.drop_sequence;
      for (int64_t i = 0; i < q_width; ++i) wrong += std::isnan(values[static_cast<std::size_t>(row * q_width + i)]) != poisoned;
    }
    harness.record_result({"block_attention", shape, static_cast<double>(wrong), 0.0,
                           "missing block: its rows NaN, others finite (error = wrong elements)", wrong == 0,
                           seconds_since(start)});
    return;
  }
  harness.reference().block_attention(q.reference, reference_pool, block_table.reference, reference_blocks, params,
                                      out.reference);
  // CUDA cores in FP32 whatever the compute dtype: the F32 tolerance.
  harness.record("block_attention", shape, out, kF32Tolerance, seconds_since(start));
}

}  // namespace

void test_block_attention(Harness& harness) {
  std::vector<BlockAttentionCase> cases{
      // beam-nano's drafter: 4/2 heads of 64, a ring of 256 positions per block, window 128, blocks of 8; anchors at
      // 0 (the block alone), inside the first window, at its edge and past it.
      {"drafter", 4, 2, 64, 256, 128, 8, DType::F32, {8, 100, 135, 136, 137, 300, 511}},
      {"drafter 1 block", 4, 2, 64, 256, 128, 8, DType::F32, {263}},
      {"drafter 16 blocks", 4, 2, 64, 256, 128, 8, DType::F32,
       {9, 40, 128, 129, 130, 131, 200, 255, 256, 257, 300, 383, 384, 400, 450, 511}},
      // Beam-1.0's drafter shapes: 16-row blocks, groups of 8 (the pairs of a block span several thread blocks).
      {"16 rows GQA 64/8", 64, 8, 128, 16, 600, 16, DType::F32, {16, 700, 650}},
      {"16 rows GQA 32/4 bf16", 32, 4, 128, 16, 512, 16, DType::BF16, {600, 17, 528}},
      {"global", 8, 2, 128, 16, 0, 8, DType::F32, {8, 333, 70}},
      // A window narrower than the block, odd dims and block sizes, one head per kv head, FP8 codes.
      {"window 5", 6, 3, 40, 4, 5, 8, DType::F32, {8, 9, 13, 50}},
      {"odd dims", 6, 3, 40, 12, 30, 4, DType::BF16, {4, 29, 31, 100}},
      {"MHA 4/4 dim 32", 4, 4, 32, 8, 20, 7, DType::F32, {7, 26, 27, 64}},
      {"head_dim 256", 8, 2, 256, 16, 64, 8, DType::F32, {80, 8}},
      {"fp8 kv", 4, 2, 64, 256, 128, 8, DType::F8_E4M3, {8, 200, 511}},
      {"missing block", 4, 2, 64, 16, 128, 8, DType::F32, {300, 40, 150}, 1},
  };
  const bool device_semantics = harness.device().device() != Device::Cpu;
  for (const BlockAttentionCase& c : cases) {
    if (c.drop_sequence >= 0 && !device_semantics) continue;
    test_block_attention_case(harness, c);
  }
}

// ---- perf ----

namespace {

struct PerfOptions {
  int64_t iterations = 15;
  int64_t repeats = 10;
  uint64_t seed = 1;
  std::string filter;
  std::string dtype = "float32";
  std::string kv_cache_dtype = "bfloat16";
  // Each sample replays one CUDA graph of the back-to-back calls (the decode step's way), so that the host's work per
  // call (the plan, the launches) is not timed.
  bool graph = false;
};

#ifdef BEAMLINE_HAVE_CUDA
constexpr int64_t kHeads = 48, kKvHeads = 8, kDim = 128;
constexpr int32_t kBlockSize = 16, kWindow = 512;
// Batches whose KV fits in L2 (60 MB) are replicated over this many bytes of the pool, used in turn.
constexpr double kRotationBytes = 512e6;

struct Case {
  std::string name;
  int64_t batch;   // sequences
  int64_t cached;  // positions already in the cache before this step
  int64_t added;   // query rows per sequence
  int32_t window;
};

void check(cudaError_t status, const char* what) { check_cuda(status, "attention", what); }

int64_t visible_keys(int64_t position, int32_t window) {
  return window > 0 ? std::min<int64_t>(position + 1, window) : position + 1;
}

void run_perf(const PerfOptions& options) {
  require(options.iterations >= 1 && options.repeats >= 1, "perf attention: --iterations and --repeats must be >= 1");
  const std::vector<Case> cases{
      {"decode global B=1 L=8K", 1, 8191, 1, 0},
      {"decode global B=1 L=32K", 1, 32767, 1, 0},
      {"decode global B=1 L=128K", 1, 131071, 1, 0},
      {"decode global B=1 L=1M", 1, 1048575, 1, 0},
      {"decode global B=32 L=8K", 32, 8191, 1, 0},
      {"decode global B=128 L=4K", 128, 4095, 1, 0},
      {"decode window-512 B=1 L=8K", 1, 8191, 1, kWindow},
      {"decode window-512 B=128 L=4K", 128, 4095, 1, kWindow},
      {"prefill causal 8K tokens", 1, 0, 8192, 0},
      {"prefill window-512 32K tokens", 1, 0, 32768, kWindow},
  };
  CudaBackend backend;
  backend.set_compute_dtype(options.dtype == "float32" ? ComputeDType::Float32 : ComputeDType::BFloat16);
  int64_t pool_blocks = 0;
  for (const Case& c : cases) {
    const int64_t per_sequence = (c.cached + c.added + kBlockSize - 1) / kBlockSize;
    pool_blocks = std::max(pool_blocks, c.batch * per_sequence);
  }
  const std::vector<int64_t> pool_shape{pool_blocks, 1, kBlockSize, kKvHeads, kDim};
  // FP8 pools (--kv-cache-dtype fp8): E4M3 codes of normal(0, 1) and the layer's (k_scale, v_scale) on the device, as
  // the model passes them (1.0 here), so that the kernels' scale reads are timed.
  const DType kv_dtype = options.kv_cache_dtype == "fp8" ? DType::F8_E4M3 : DType::BF16;
  PagedKvPool pool{backend.random_weight(kv_dtype, pool_shape, options.seed, 0.0f, 1.0f),
                   backend.random_weight(kv_dtype, pool_shape, options.seed + 1, 0.0f, 1.0f)};
  if (kv_dtype == DType::F8_E4M3) pool.scales = backend.upload_f32(std::vector<float>{1.0f, 1.0f}, {2});
  const double element_bytes = static_cast<double>(dtype_size(kv_dtype));
  const double block_bytes = 2.0 * element_bytes * kBlockSize * kKvHeads * kDim;  // K and V
  spdlog::info("perf attention: {}, {} KV pool of {} blocks ({:.2f} GiB), compute dtype {}",
               backend.device_description(), dtype_name(kv_dtype), pool_blocks,
               static_cast<double>(pool_blocks) * block_bytes / (1ull << 30), options.dtype);
  std::mt19937_64 rng(options.seed);
  cudaEvent_t marks[2];
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");

  std::printf("\n| case | ms | bytes or FLOPs | achieved | floor ms | %% of floor |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const Case& c : cases) {
    if (!options.filter.empty() && c.name.find(options.filter) == std::string::npos) continue;
    const int64_t per_sequence = (c.cached + c.added + kBlockSize - 1) / kBlockSize;
    const int64_t rows = c.batch * c.added;
    std::vector<int32_t> positions, query_start{0}, seq_lens;
    double keys = 0.0, pairs = 0.0;  // KV positions read per kv head; (query row, key) pairs
    for (int64_t s = 0; s < c.batch; ++s) {
      for (int64_t i = 0; i < c.added; ++i) {
        positions.push_back(static_cast<int32_t>(c.cached + i));
        pairs += static_cast<double>(visible_keys(c.cached + i, c.window));
      }
      query_start.push_back(static_cast<int32_t>((s + 1) * c.added));
      seq_lens.push_back(static_cast<int32_t>(c.cached + c.added));
      keys += static_cast<double>(c.window > 0 ? std::min<int64_t>(c.cached + c.added, c.window) : c.cached + c.added);
    }
    const AttentionBatch batch = backend.make_attention_batch(positions, query_start, seq_lens);
    const double kv_bytes = keys * kKvHeads * kDim * 2.0 * element_bytes;
    const bool decode = c.added == 1;
    // Block tables over disjoint, shuffled parts of the pool, enough of them to defeat L2.
    const int64_t needed = c.batch * per_sequence;
    const int64_t rotations =
        std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kRotationBytes / (needed * block_bytes))), 1,
                            pool_blocks / needed);
    std::vector<int32_t> order(static_cast<std::size_t>(pool_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Tensor> tables;
    for (int64_t r = 0; r < rotations; ++r)
      tables.push_back(backend.upload_i32(
          std::vector<int32_t>(order.begin() + r * needed, order.begin() + (r + 1) * needed), {c.batch, per_sequence}));
    const Tensor q = backend.random_weight(DType::F32, {rows, kHeads * kDim}, options.seed + 2, 0.0f, 1.0f);
    Tensor out = backend.alloc(DType::F32, {rows, kHeads * kDim});
    AttentionParams params;
    params.num_heads = kHeads;
    params.num_kv_heads = kKvHeads;
    params.head_dim = kDim;
    params.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    params.sliding_window = c.window;

    int64_t call = 0;
    auto attend = [&] {
      backend.paged_attention(q, pool, tables[static_cast<std::size_t>(call++ % rotations)], batch, params, out);
    };
    for (int64_t i = 0; i < std::max<int64_t>(3, rotations); ++i) attend();
    std::unique_ptr<OpGraph> graph;
    if (options.graph) {
      backend.begin_capture();
      for (int64_t r = 0; r < options.repeats; ++r) attend();
      graph = backend.end_capture();
      backend.replay(*graph);
    }
    std::vector<double> samples;
    for (int64_t i = 0; i < options.iterations; ++i) {
      check(cudaEventRecord(marks[0], backend.stream()), "cudaEventRecord");
      if (graph != nullptr)
        backend.replay(*graph);
      else
        for (int64_t r = 0; r < options.repeats; ++r) attend();
      check(cudaEventRecord(marks[1], backend.stream()), "cudaEventRecord");
      check(cudaEventSynchronize(marks[1]), "cudaEventSynchronize");
      float elapsed = 0.0f;
      check(cudaEventElapsedTime(&elapsed, marks[0], marks[1]), "cudaEventElapsedTime");
      samples.push_back(static_cast<double>(elapsed) / static_cast<double>(options.repeats));
    }
    const std::vector<float> result = backend.download_f32(out);
    require(std::all_of(result.begin(), result.end(), [](float v) { return std::isfinite(v); }),
            "perf attention: {} produced a non-finite output", c.name);
    const double ms = median(samples);
    if (decode) {
      const double floor_ms = kv_bytes / kHbmBytesPerSecond * 1e3;
      std::printf("| %s | %.4f | %.1f MB | %.2f TB/s | %.4f | %.0f%% |\n", c.name.c_str(), ms, kv_bytes / 1e6,
                  kv_bytes / (ms * 1e-3) / 1e12, floor_ms, 100.0 * floor_ms / ms);
    } else {
      const double flops = 4.0 * kDim * kHeads * pairs;
      const double floor_ms = flops / kBf16FlopsPerSecond * 1e3;
      std::printf("| %s | %.3f | %.1f GFLOP | %.1f TFLOP/s | %.3f | %.1f%% |\n", c.name.c_str(), ms, flops / 1e9,
                  flops / (ms * 1e-3) / 1e12, floor_ms, 100.0 * floor_ms / ms);
    }
    std::fflush(stdout);
  }
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);
  std::printf("\ncompute dtype %s; median of %lld samples of %lld back-to-back calls each%s; decode floors count K "
              "and V bytes read, prefill floors 4 x head_dim FLOPs per (query head, visible key) at dense BF16 GEMM "
              "speed\n",
              options.dtype.c_str(), static_cast<long long>(options.iterations),
              static_cast<long long>(options.repeats), options.graph ? ", replayed as one CUDA graph" : "");
}
#endif

}  // namespace

void add_attention_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "attention",
      "Time paged attention (decode and prefill, Beam-1.0 shapes, BF16 or FP8 KV) on the GPU next to the HBM and "
      "tensor-core floors");
  command->add_option("--iterations", options->iterations, "timed samples per case (median reported)")
      ->capture_default_str();
  command->add_option("--repeats", options->repeats, "back-to-back calls per sample")->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the random KV pool and queries")->capture_default_str();
  command->add_option("--filter", options->filter, "only the cases whose name contains this");
  command->add_option("--dtype", options->dtype,
                      "compute dtype: float32 (FP32-accurate split operands) or bfloat16 (one rounding)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  command
      ->add_option("--kv-cache-dtype", options->kv_cache_dtype,
                   "the pool's dtype: bfloat16, or fp8 (E4M3; k_scale = v_scale = 1.0, read from the device)")
      ->check(CLI::IsMember({"bfloat16", "fp8"}))
      ->capture_default_str();
  command->add_flag("--graph", options->graph,
                    "time one CUDA graph of each sample's calls (no host work per call, as in the decode step)");
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("attention");
#endif
  });
}

}  // namespace beamline::backend_ops

// write_kv + paged_attention against a naive softmax over the visible keys: causal, sliding windows (exactly
// at the boundary), GQA, varlen batches over shuffled block tables, F32, BF16 and FP8 (E4M3) pools with and without
// per-tensor KV scales (and amax_scale, which computes them), given-back blocks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend_test_support.h"
#include "kv/kv_cache_layout.h"
#include "model/forward_batch.h"
#include "quant/element_codes.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

struct Case {
  int32_t heads, kv_heads, dim, window, block_size;
  DType pool_dtype;
  std::vector<int32_t> lengths;  // positions per sequence after the step
  std::vector<int32_t> queries;  // new rows per sequence (its last positions)
  float magnitude = 1.0f;         // K and V are normal(0, 1) times this
  bool kv_scales = false;         // FP8 pools: per-tensor scales from amax_scale (--calculate-kv-scales), else 1.0
};

struct PoolSetup {
  PagedKvPool pool;
  Tensor block_table;
  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<float>> k, v;  // per sequence [length, kv_heads * dim], rounded through the pool dtype
  float k_scale = 1.0f, v_scale = 1.0f;  // FP8 pools: the scales the pool was written with
};

// FP8: the E4M3 code of value / scale (saturating), times scale.
float round_through(float value, DType dtype, float scale = 1.0f) {
  if (dtype == DType::F8_E4M3) return fp8_e4m3_to_f32(f32_to_e4m3(value / scale)) * scale;
  return dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(value)) : value;
}

// ‖out − ref‖ / ‖ref‖.
double relative_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double error = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    error += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(error / norm);
}

float max_abs(const std::vector<float>& values) {
  float amax = 0.0f;
  for (float value : values) amax = std::max(amax, std::abs(value));
  return amax;
}

// Writes every position of every sequence into a fresh pool through shuffled block tables.
PoolSetup write_sequences(Backend& backend, Random& random, const Case& c) {
  PoolSetup setup;
  const int64_t width = int64_t{c.kv_heads} * c.dim;
  int32_t max_blocks = 0, total_blocks = 0;
  for (int32_t length : c.lengths) {
    const int32_t blocks = (length + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
  }
  const int32_t pool_blocks = total_blocks + 3;
  const std::vector<int64_t> shape{pool_blocks, 2, c.block_size, c.kv_heads, c.dim};
  setup.pool.k = backend.alloc(c.pool_dtype, shape);
  setup.pool.v = backend.alloc(c.pool_dtype, shape);
  backend.fill_zero(setup.pool.k);
  backend.fill_zero(setup.pool.v);
  std::vector<int32_t> blocks(static_cast<std::size_t>(pool_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), random.engine());
  std::vector<int32_t> flat_table(c.lengths.size() * static_cast<std::size_t>(max_blocks), kNullBlock);
  std::size_t next = 0;
  std::vector<int32_t> positions, query_start{0};
  std::vector<float> k_rows, v_rows;
  for (std::size_t s = 0; s < c.lengths.size(); ++s) {
    setup.tables.emplace_back();
    for (int32_t i = 0; i * c.block_size < c.lengths[s]; ++i) {
      setup.tables[s].push_back(blocks[next++]);
      flat_table[s * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(i)] = setup.tables[s].back();
    }
    std::vector<float> k = random.normal(static_cast<std::size_t>(c.lengths[s] * width), c.magnitude);
    std::vector<float> v = random.normal(k.size(), c.magnitude);
    k_rows.insert(k_rows.end(), k.begin(), k.end());
    v_rows.insert(v_rows.end(), v.begin(), v.end());
    setup.k.push_back(std::move(k));
    setup.v.push_back(std::move(v));
    for (int32_t p = 0; p < c.lengths[s]; ++p) positions.push_back(p);
    query_start.push_back(static_cast<int32_t>(positions.size()));
  }
  const auto rows = static_cast<int64_t>(positions.size());
  const Tensor k = backend.upload_f32(k_rows, {rows, width}), v = backend.upload_f32(v_rows, {rows, width});
  if (c.kv_scales) {
    setup.pool.scales = backend.alloc(DType::F32, {2});
    Tensor k_scale = setup.pool.scales.view(0, {1}), v_scale = setup.pool.scales.view(1, {1});
    backend.amax_scale(k, 200.0f, k_scale);
    backend.amax_scale(v, 100.0f, v_scale);
    const std::vector<float> scales = backend.download_f32(setup.pool.scales);
    setup.k_scale = scales[0];
    setup.v_scale = scales[1];
    // vLLM's recipe, exactly: max|k| / 200 and max|v| / 100 (both divisions IEEE).
    EXPECT_EQ(setup.k_scale, max_abs(k_rows) / 200.0f);
    EXPECT_EQ(setup.v_scale, max_abs(v_rows) / 100.0f);
  }
  for (auto& sequence : setup.k)
    for (float& value : sequence) value = round_through(value, c.pool_dtype, setup.k_scale);
  for (auto& sequence : setup.v)
    for (float& value : sequence) value = round_through(value, c.pool_dtype, setup.v_scale);
  setup.block_table = backend.upload_i32(flat_table, {static_cast<int64_t>(c.lengths.size()), max_blocks});
  const AttentionBatch all = backend.make_attention_batch(positions, query_start, c.lengths);
  backend.write_kv(k, v, setup.pool, 1, setup.block_table, all);
  return setup;
}

AttentionBatch query_batch(Backend& backend, const Case& c) {
  std::vector<int32_t> positions, query_start{0};
  for (std::size_t s = 0; s < c.lengths.size(); ++s) {
    for (int32_t p = c.lengths[s] - c.queries[s]; p < c.lengths[s]; ++p) positions.push_back(p);
    query_start.push_back(static_cast<int32_t>(positions.size()));
  }
  return backend.make_attention_batch(positions, query_start, c.lengths);
}

AttentionParams params_of(const Case& c) {
  AttentionParams params;
  params.num_heads = c.heads;
  params.num_kv_heads = c.kv_heads;
  params.head_dim = c.dim;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  params.sliding_window = c.window;
  params.slot = 1;
  return params;
}

std::vector<double> naive_attention(const Case& c, const PoolSetup& setup, const std::vector<float>& q) {
  std::vector<double> out;
  const int32_t group = c.heads / c.kv_heads;
  std::size_t row = 0;
  for (std::size_t s = 0; s < c.lengths.size(); ++s) {
    for (int32_t p = c.lengths[s] - c.queries[s]; p < c.lengths[s]; ++p, ++row) {
      for (int32_t h = 0; h < c.heads; ++h) {
        const float* query = q.data() + (row * c.heads + h) * c.dim;
        const int32_t kv = h / group;
        std::vector<double> scores;
        std::vector<int32_t> keys;
        for (int32_t t = 0; t <= p; ++t) {
          if (c.window > 0 && p - t >= c.window) continue;
          const float* key = setup.k[s].data() + (int64_t{t} * c.kv_heads + kv) * c.dim;
          double dot = 0;
          for (int32_t d = 0; d < c.dim; ++d) dot += double{query[d]} * key[d];
          scores.push_back(dot / std::sqrt(static_cast<double>(c.dim)));
          keys.push_back(t);
        }
        const double max_score = *std::max_element(scores.begin(), scores.end());
        double total = 0;
        for (double& score : scores) total += (score = std::exp(score - max_score));
        for (int32_t d = 0; d < c.dim; ++d) {
          double sum = 0;
          for (std::size_t i = 0; i < keys.size(); ++i)
            sum += scores[i] / total * setup.v[s][(int64_t{keys[i]} * c.kv_heads + kv) * c.dim + d];
          out.push_back(sum);
        }
      }
    }
  }
  return out;
}

using AttentionTest = BackendTest;

TEST_P(AttentionTest, MatchesNaiveSoftmaxOverVisibleKeys) {
  Random random(20);
  const std::vector<Case> cases{
      {1, 1, 8, 0, 4, DType::F32, {1}, {1}},                      // a single token
      {4, 2, 16, 0, 16, DType::F32, {37}, {37}},                  // causal prefill, GQA 2
      {6, 3, 12, 8, 4, DType::F32, {30}, {30}},                   // window smaller than the prompt
      {3, 1, 10, 5, 1, DType::F32, {23, 5, 14}, {23, 1, 4}},      // odd heads, 1 KV head, varlen, block size 1
      {8, 8, 32, 16, 8, DType::F32, {70, 3}, {1, 3}},             // decode row next to a prefill, MHA
      {4, 1, 64, 0, 16, DType::BF16, {50, 17}, {2, 17}},          // BF16 pool
      {5, 5, 6, 4, 2, DType::BF16, {9, 9, 9}, {1, 9, 3}},         // BF16, window 4
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const PoolSetup setup = write_sequences(backend(), random, c);
    const AttentionBatch batch = query_batch(backend(), c);
    const int64_t rows = batch.num_rows(), width = int64_t{c.heads} * c.dim;
    const std::vector<float> q = random.normal(static_cast<std::size_t>(rows * width));
    Tensor out = backend().alloc(DType::F32, {rows, width});
    backend().paged_attention(backend().upload_f32(q, {rows, width}), setup.pool, setup.block_table, batch,
                              params_of(c), out);
    expect_close(backend().download_f32(out), naive_attention(c, setup, q), 1e-5, fmt::format("case {}", i));
  }
}

// --kv-cache-dtype fp8: K and V stored as E4M3 (scale 1.0); attention equals the naive one over the rounded keys and
// values. Values beyond ±448 saturate.
TEST_P(AttentionTest, Fp8PoolMatchesNaiveSoftmaxOverRoundedKeys) {
  Random random(22);
  const std::vector<Case> cases{
      {4, 2, 16, 0, 16, DType::F8_E4M3, {37}, {37}},           // causal prefill, GQA 2
      {5, 5, 6, 4, 2, DType::F8_E4M3, {9, 9, 9}, {1, 9, 3}},   // window 4, varlen
      {8, 1, 64, 16, 8, DType::F8_E4M3, {70, 3}, {1, 3}},      // decode row next to a prefill, GQA 8
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const PoolSetup setup = write_sequences(backend(), random, c);
    const AttentionBatch batch = query_batch(backend(), c);
    const int64_t rows = batch.num_rows(), width = int64_t{c.heads} * c.dim;
    const std::vector<float> q = random.normal(static_cast<std::size_t>(rows * width));
    Tensor out = backend().alloc(DType::F32, {rows, width});
    backend().paged_attention(backend().upload_f32(q, {rows, width}), setup.pool, setup.block_table, batch,
                              params_of(c), out);
    expect_close(backend().download_f32(out), naive_attention(c, setup, q), 1e-5, fmt::format("fp8 case {}", i));
  }
  // Saturation: a key of 1000 is stored as 448.
  PagedKvPool pool{backend().alloc(DType::F8_E4M3, {1, 1, 1, 1, 2}), backend().alloc(DType::F8_E4M3, {1, 1, 1, 1, 2})};
  const AttentionBatch one = backend().make_attention_batch({0}, {0, 1}, {1});
  backend().write_kv(backend().upload_f32(std::vector<float>{1000.0f, -0.3f}, {1, 2}),
                     backend().upload_f32(std::vector<float>{-1000.0f, 0.0f}, {1, 2}), pool, 0,
                     backend().upload_i32(std::vector<int32_t>{0}, {1, 1}), one);
  uint8_t k_codes[2] = {}, v_codes[2] = {};
  backend().download(pool.k, k_codes);
  backend().download(pool.v, v_codes);
  EXPECT_EQ(k_codes[0], f32_to_e4m3(448.0f));
  EXPECT_EQ(v_codes[0], f32_to_e4m3(-448.0f));
  EXPECT_EQ(fp8_e4m3_to_f32(k_codes[1]), round_through(-0.3f, DType::F8_E4M3));
}

// vLLM's per-tensor KV scales: K and V of magnitude 1024 (past E4M3's ±448) and 1/1024 (under its 2^-6 normal range).
// With scales from amax_scale the FP8 pool equals the naive attention over the values rounded through e4m3(x / s) * s,
// and stays within a few percent of the unrounded (F32) attention; with scale 1.0 it is far off. The head_dim 128
// decode rows take the CUDA backend's tensor-core decode kernel, the others its generic kernel.
TEST_P(AttentionTest, Fp8PoolWithScalesHoldsExtremeMagnitudes) {
  for (float magnitude : {1024.0f, 1.0f / 1024.0f}) {
    const std::vector<Case> cases{
        {4, 2, 16, 0, 16, DType::F8_E4M3, {37}, {37}, magnitude},                 // causal prefill, GQA 2
        {8, 2, 128, 0, 16, DType::F8_E4M3, {300, 70, 5}, {1, 3, 2}, magnitude},   // decode rows, GQA 4
        {6, 3, 40, 4, 4, DType::F8_E4M3, {14, 3}, {11, 2}, magnitude},            // odd dims, window 4
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const std::string what = fmt::format("magnitude {} case {}", magnitude, i);
      Case scaled = cases[i], unscaled = cases[i], exact = cases[i];
      scaled.kv_scales = true;
      exact.pool_dtype = DType::F32;
      Random draw_scaled(30 + i), draw_unscaled(30 + i), draw_exact(30 + i);  // the same K, V and q for all three
      const PoolSetup with_scales = write_sequences(backend(), draw_scaled, scaled);
      const PoolSetup without = write_sequences(backend(), draw_unscaled, unscaled);
      const PoolSetup reference = write_sequences(backend(), draw_exact, exact);
      const AttentionBatch batch = query_batch(backend(), scaled);
      const int64_t rows = batch.num_rows(), width = int64_t{scaled.heads} * scaled.dim;
      // q of magnitude 1 / magnitude keeps the scores O(1) (as a model's q and k projections would).
      const std::vector<float> q = draw_scaled.normal(static_cast<std::size_t>(rows * width), 1.0f / magnitude);
      auto attend = [&](const PoolSetup& setup) {
        Tensor out = backend().alloc(DType::F32, {rows, width});
        backend().paged_attention(backend().upload_f32(q, {rows, width}), setup.pool, setup.block_table, batch,
                                  params_of(scaled), out);
        return backend().download_f32(out);
      };
      const std::vector<float> scaled_out = attend(with_scales), unscaled_out = attend(without);
      // Outputs are sums of values of magnitude `magnitude` that partly cancel: errors are judged against the whole
      // output's norm (‖out − ref‖ / ‖ref‖), as the op harness does.
      EXPECT_LT(relative_error(scaled_out, naive_attention(scaled, with_scales, q)), 1e-5)
          << what << " against its codes";
      const std::vector<double> exact_out = naive_attention(exact, reference, q);
      EXPECT_LT(relative_error(scaled_out, exact_out), 0.05) << what << ": FP8 with scales against F32";
      EXPECT_GT(relative_error(unscaled_out, exact_out), 0.3) << what << ": FP8 at scale 1.0 against F32";
    }
  }
}

// The scales live on the device and are read at run time: a decode step recorded as a graph while they were 1.0
// replays with the scales set after it (--calculate-kv-scales fills them in the first step, graphs may exist before).
// Backends without graphs (the CPU) skip.
TEST_P(AttentionTest, RecordedStepsReadTheScalesSetAfterRecording) {
  if (!backend().supports_graphs()) GTEST_SKIP() << backend().name() << " records no graphs";
  Random random(40);
  Case c{8, 2, 128, 0, 16, DType::F8_E4M3, {300, 70, 17}, {1, 1, 1}, 1024.0f, true};
  const PoolSetup setup = write_sequences(backend(), random, c);
  const std::vector<float> scales = backend().download_f32(setup.pool.scales);
  PagedKvPool pool = setup.pool;
  backend().copy_to(pool.scales, std::vector<float>{1.0f, 1.0f}.data());
  // The step rewrites each sequence's last position with the values it holds (the same codes) and attends.
  const AttentionBatch batch = query_batch(backend(), c);
  const int64_t width = int64_t{c.kv_heads} * c.dim, rows = batch.num_rows(), q_width = int64_t{c.heads} * c.dim;
  std::vector<float> k_rows, v_rows;
  for (std::size_t s = 0; s < c.lengths.size(); ++s) {
    const int64_t last = (c.lengths[s] - 1) * width;
    k_rows.insert(k_rows.end(), setup.k[s].begin() + last, setup.k[s].begin() + last + width);
    v_rows.insert(v_rows.end(), setup.v[s].begin() + last, setup.v[s].begin() + last + width);
  }
  const Tensor k = backend().upload_f32(k_rows, {rows, width}), v = backend().upload_f32(v_rows, {rows, width});
  const std::vector<float> q = random.normal(static_cast<std::size_t>(rows * q_width), 1.0f / c.magnitude);
  const Tensor q_tensor = backend().upload_f32(q, {rows, q_width});
  Tensor out = backend().alloc(DType::F32, {rows, q_width});
  backend().begin_capture();
  backend().write_kv(k, v, pool, 1, setup.block_table, batch);
  backend().paged_attention(q_tensor, pool, setup.block_table, batch, params_of(c), out);
  const std::unique_ptr<OpGraph> graph = backend().end_capture();
  backend().copy_to(pool.scales, scales.data());
  backend().replay(*graph);
  EXPECT_LT(relative_error(backend().download_f32(out), naive_attention(c, setup, q)), 1e-5) << "replayed step";
}

// Where max|x| is 0 (or only NaN), the scale is 1.0: a scale of 0 would make every code NaN.
TEST_P(AttentionTest, AmaxScaleOfZerosIsOne) {
  Tensor out = backend().alloc(DType::F32, {3});
  Tensor first = out.view(0, {1}), second = out.view(1, {1}), third = out.view(2, {1});
  backend().amax_scale(backend().upload_f32(std::vector<float>(100, 0.0f), {10, 10}), 200.0f, first);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  backend().amax_scale(backend().upload_f32(std::vector<float>{nan, -3.0f, nan, 1.0f}, {4}), 100.0f, second);
  backend().amax_scale(backend().upload_f32(std::vector<float>{nan, nan}, {2}), 100.0f, third);
  EXPECT_EQ(backend().download_f32(out), (std::vector<float>{1.0f, 0.03f, 1.0f}));
  Tensor wide = backend().alloc(DType::F32, {2});
  EXPECT_THROW(backend().amax_scale(backend().upload_f32(std::vector<float>{1.0f}, {1}), 100.0f, wide), Error);
  EXPECT_THROW(backend().amax_scale(backend().upload_f32(std::vector<float>{1.0f}, {1}), 0.0f, first), Error);
}

// q = 0 makes the softmax uniform over the visible keys; V[t] = one-hot(t) then shows exactly which keys those are.
TEST_P(AttentionTest, SlidingWindowBoundaryIsExact) {
  for (int32_t window : {1, 2, 3, 4, 7}) {
    const int32_t length = 12, dim = 16, block_size = 1;
    PagedKvPool pool{backend().alloc(DType::F32, {length, 1, block_size, 1, dim}),
                     backend().alloc(DType::F32, {length, 1, block_size, 1, dim})};
    std::vector<float> k(static_cast<std::size_t>(length * dim), 0.5f), v(k.size(), 0.0f);
    for (int32_t t = 0; t < length; ++t) v[t * dim + t] = 1.0f;
    std::vector<int32_t> positions(length), table(length);
    std::iota(positions.begin(), positions.end(), 0);
    std::iota(table.begin(), table.end(), 0);
    const AttentionBatch batch = backend().make_attention_batch(positions, {0, length}, {length});
    const Tensor block_table = backend().upload_i32(table, {1, length});
    backend().write_kv(backend().upload_f32(k, {length, dim}), backend().upload_f32(v, {length, dim}), pool, 0,
                       block_table, batch);
    AttentionParams params;
    params.num_heads = params.num_kv_heads = 1;
    params.head_dim = dim;
    params.scale = 1.0f;
    params.sliding_window = window;
    Tensor out = backend().alloc(DType::F32, {length, dim});
    backend().paged_attention(backend().upload_f32(std::vector<float>(k.size(), 0.0f), {length, dim}), pool,
                              block_table, batch, params, out);
    const std::vector<float> result = backend().download_f32(out);
    for (int32_t p = 0; p < length; ++p) {
      const int32_t visible = std::min(p + 1, window);
      for (int32_t t = 0; t < dim; ++t) {
        const bool expected_visible = t <= p && p - t < window;
        EXPECT_NEAR(result[p * dim + t], expected_visible ? 1.0 / visible : 0.0, 1e-6)
            << "window " << window << " query " << p << " key " << t;
      }
    }
  }
}

TEST_P(AttentionTest, GivenBackBlocksOutsideTheWindowAreNeverRead) {
  Random random(21);
  Case c{4, 2, 8, 8, 4, DType::F32, {29}, {3}};
  PoolSetup setup = write_sequences(backend(), random, c);
  // Queries at 26..28 with window 8 see keys >= 19: blocks 0..3 (positions 0..15) are not needed.
  std::vector<int32_t> table = setup.tables[0];
  for (int i = 0; i < 4; ++i) table[i] = kNullBlock;
  const Tensor trimmed = backend().upload_i32(table, {1, static_cast<int64_t>(table.size())});
  const AttentionBatch batch = query_batch(backend(), c);
  const std::vector<float> q = random.normal(3 * 4 * 8);
  Tensor out = backend().alloc(DType::F32, {3, 32});
  backend().paged_attention(backend().upload_f32(q, {3, 32}), setup.pool, trimmed, batch, params_of(c), out);
  expect_close(backend().download_f32(out), naive_attention(c, setup, q), 1e-5, "trimmed table");
  if (backend().name() == "cpu") {  // the reference checks what a device kernel may only assume
    table[4] = kNullBlock;          // positions 16..19: 19 is still visible
    const Tensor broken = backend().upload_i32(table, {1, static_cast<int64_t>(table.size())});
    EXPECT_THROW(backend().paged_attention(backend().upload_f32(q, {3, 32}), setup.pool, broken, batch, params_of(c),
                                           out),
                 Error);
  }
}

// block_attention (the block drafter's): S blocks of B rows, block-row-major; block row i of sequence s, at
// p = length - B + i, sees every key from its window's start to the sequence's last (the block's later keys too).
// Against the naive softmax over those keys, and, as the drafter used to compute it, against B paged_attention calls
// (row i a query at the block's last position with a window of W + B - 1 - i keys): bit for bit on the CPU, where both
// ops share one computation.
TEST_P(AttentionTest, BlockAttentionSeesTheWindowAndTheWholeBlock) {
  Random random(21);
  struct BlockCase {
    Case keys;  // lengths: keys per sequence, the block its last `block`
    int32_t block;
  };
  const std::vector<BlockCase> cases{
      {{4, 2, 64, 16, 32, DType::F32, {8, 20, 23, 24, 60}, {}}, 8},  // window 16 edges, anchors 0.., blocks of 8
      {{6, 3, 12, 5, 4, DType::F32, {9, 30}, {}}, 7},                // a window narrower than the block
      {{4, 4, 8, 0, 2, DType::BF16, {3, 40}, {}}, 3},                // global, MHA, BF16 pool
      {{8, 2, 16, 10, 8, DType::F32, {12}, {}}, 12},                 // one block that is all the sequence
  };
  for (std::size_t n = 0; n < cases.size(); ++n) {
    const Case& c = cases[n].keys;
    const int32_t block = cases[n].block;
    const PoolSetup setup = write_sequences(backend(), random, c);
    const auto sequences = static_cast<int32_t>(c.lengths.size());
    std::vector<int32_t> last_positions, one_row{0};
    for (int32_t length : c.lengths) {
      last_positions.push_back(length - 1);
      one_row.push_back(one_row.back() + 1);
    }
    const AttentionBatch blocks = backend().make_attention_batch(last_positions, one_row, c.lengths);
    const int64_t rows = int64_t{block} * sequences, width = int64_t{c.heads} * c.dim;
    const std::vector<float> q = random.normal(static_cast<std::size_t>(rows * width));
    const Tensor q_tensor = backend().upload_f32(q, {rows, width});
    Tensor out = backend().alloc(DType::F32, {rows, width});
    backend().block_attention(q_tensor, setup.pool, setup.block_table, blocks, params_of(c), out);
    const std::vector<float> got = backend().download_f32(out);

    std::vector<double> expected;
    const int32_t group = c.heads / c.kv_heads;
    for (int64_t row = 0; row < rows; ++row) {
      const auto s = static_cast<std::size_t>(row % sequences);
      const int32_t length = c.lengths[s], p = length - block + static_cast<int32_t>(row / sequences);
      for (int32_t h = 0; h < c.heads; ++h) {
        const float* query = q.data() + (row * c.heads + h) * c.dim;
        const int32_t kv = h / group;
        std::vector<double> weights;
        const auto first = static_cast<int32_t>(first_visible_position(p, c.window));
        for (int32_t t = first; t < length; ++t) {
          double dot = 0;
          for (int32_t d = 0; d < c.dim; ++d) dot += double{query[d]} * setup.k[s][(int64_t{t} * c.kv_heads + kv) * c.dim + d];
          weights.push_back(dot / std::sqrt(static_cast<double>(c.dim)));
        }
        const double max_score = *std::max_element(weights.begin(), weights.end());
        double total = 0;
        for (double& w : weights) total += (w = std::exp(w - max_score));
        for (int32_t d = 0; d < c.dim; ++d) {
          double sum = 0;
          for (int32_t t = first; t < length; ++t)
            sum += weights[static_cast<std::size_t>(t - first)] / total *
                   setup.v[s][(int64_t{t} * c.kv_heads + kv) * c.dim + d];
          expected.push_back(sum);
        }
      }
    }
    expect_close(got, expected, 1e-5, fmt::format("case {}", n));

    Tensor by_rows = backend().alloc(DType::F32, {rows, width});
    for (int32_t i = 0; i < block; ++i) {
      AttentionParams params = params_of(c);
      if (c.window > 0) params.sliding_window = c.window + block - 1 - i;
      const Tensor rows_q = q_tensor.view(int64_t{i} * sequences * width, {sequences, width});
      Tensor rows_out = by_rows.view(int64_t{i} * sequences * width, {sequences, width});
      backend().paged_attention(rows_q, setup.pool, setup.block_table, blocks, params, rows_out);
    }
    const std::vector<float> rows_result = backend().download_f32(by_rows);
    if (GetParam() == "cpu") {
      EXPECT_EQ(got, rows_result) << "case " << n;
    } else {
      expect_close(got, std::vector<double>(rows_result.begin(), rows_result.end()), 1e-5, fmt::format("case {} rows", n));
    }
  }
}

// A bad call names the op and what is wrong.
TEST_P(AttentionTest, BlockAttentionRefusesBlocksThatAreNotOneRowAtTheirEnd) {
  Random random(22);
  const Case c{4, 2, 8, 0, 4, DType::F32, {10, 12}, {}};
  const PoolSetup setup = write_sequences(backend(), random, c);
  const Tensor q = backend().alloc(DType::F32, {8, 32});
  Tensor out = backend().alloc(DType::F32, {8, 32});
  const AttentionBatch not_last = backend().make_attention_batch({8, 11}, {0, 1, 2}, {10, 12});
  try {
    backend().block_attention(q, setup.pool, setup.block_table, not_last, params_of(c), out);
    FAIL() << "a block row before its sequence's end was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("block_attention: block 0 is not one row at its last position"),
              std::string::npos)
        << error.what();
  }
  const AttentionBatch blocks = backend().make_attention_batch({9, 11}, {0, 1, 2}, {10, 12});
  const Tensor ragged = backend().alloc(DType::F32, {7, 32});
  Tensor ragged_out = backend().alloc(DType::F32, {7, 32});
  EXPECT_THROW(backend().block_attention(ragged, setup.pool, setup.block_table, blocks, params_of(c), ragged_out),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionTest, ::testing::ValuesIn(backend_names()));

}  // namespace
}  // namespace beamline::testing

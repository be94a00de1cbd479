// Every op of the Backend interface against naive host loops (double accumulation) on random inputs of
// several shapes, odd sizes included, on each backend this build has.
#include <algorithm>
#include <numeric>

#include "backend_test_support.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

std::vector<double> naive_rms(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t n,
                              double eps) {
  std::vector<double> out(x.size());
  for (int64_t t = 0; t < rows; ++t) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double{x[t * n + i]} * x[t * n + i];
    const double inverse = 1.0 / std::sqrt(sum / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[t * n + i] = x[t * n + i] * inverse * w[i];
  }
  return out;
}

std::vector<double> naive_matmul_wt(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t in,
                                    int64_t out) {
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < in; ++i) sum += double{x[t * in + i]} * w[o * in + i];
      y[t * out + o] = sum;
    }
  return y;
}

// Outputs of a device's GEMMs (cuBLAS with each F32 activation split into BF16 operands, FP32 sums on the tensor
// cores) are near FP32 but not at it: they get the op harness's 2e-4 (tests/backend_ops/harness.h,
// kSplitOperandTolerance; on the H200, 2026-12-02, a logit of -0.2474 came out 2.2e-5 off, over 2e-5); the CPU's
// loops keep 2e-5.
double gemm_tolerance(const Backend& backend) { return backend.device() == Device::Cpu ? 2e-5 : 2e-4; }

using OpTest = BackendTest;

// Large tensors take the CPU backend's page-returning path (≥ 16 MiB, mmap'd): a slice whose ends are not
// page-aligned must come back zero while its neighbour keeps its values.
TEST_P(OpTest, FillZeroClearsWholeTensorsAndSlicesOfLargeOnes) {
  const int64_t row = 4'500'001;  // 18 MB of F32 per row, not a multiple of a page
  Tensor both = backend().alloc(DType::F32, {2, row});
  std::vector<float> values(static_cast<std::size_t>(2 * row));
  std::iota(values.begin(), values.end(), 1.0f);
  backend().copy_to(both, values.data());
  Tensor second = both.slice_first(1);
  backend().fill_zero(second);
  const std::vector<float> after = backend().download_f32(both);
  EXPECT_TRUE(std::equal(after.begin(), after.begin() + row, values.begin()));
  EXPECT_TRUE(std::all_of(after.begin() + row, after.end(), [](float v) { return v == 0.0f; }));
  backend().fill_zero(both);
  const std::vector<float> cleared = backend().download_f32(both);
  EXPECT_TRUE(std::all_of(cleared.begin(), cleared.end(), [](float v) { return v == 0.0f; }));
}

TEST_P(OpTest, EmbeddingGathersRowsOfEveryFloatDtype) {
  Random random(1);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const int64_t vocab = 37, hidden = 19, rows = 11;
    const HostWeight table = make_weight(backend(), dtype, {vocab, hidden}, random.normal(vocab * hidden));
    std::vector<int32_t> ids(rows);
    for (auto& id : ids) id = random.integer(0, vocab - 1);
    ids[0] = vocab - 1;
    Tensor out = backend().alloc(DType::F32, {rows, hidden});
    backend().embedding(table.tensor, backend().upload_i32(ids, {rows}), out);
    std::vector<double> expected;
    for (int32_t id : ids)
      for (int64_t i = 0; i < hidden; ++i) expected.push_back(table.values[id * hidden + i]);
    expect_close(backend().download_f32(out), expected, 0.0, std::string(dtype_name(dtype)));
  }
}

TEST_P(OpTest, EmbeddingRejectsOutOfRangeIds) {
  Random random(2);
  const HostWeight table = make_weight(backend(), DType::F32, {5, 3}, random.normal(15));
  Tensor out = backend().alloc(DType::F32, {3, 3});
  const std::vector<int32_t> ids{5, 1, -1};
  const Tensor tokens = backend().upload_i32(ids, {3});
  if (backend().device() == Device::Cpu) {
    EXPECT_THROW(backend().embedding(table.tensor, tokens, out), Error);
    return;
  }
  // A device's ids live on the device (they may be the previous step's samples, never read back), so it cannot
  // raise without a synchronising read-back: the CUDA kernel writes NaN over the row of an id out of range instead
  // (backend/cuda/rows/rows.cu), as paged attention does for a missing block, and the rows of valid ids are right.
  backend().embedding(table.tensor, tokens, out);
  const std::vector<float> rows = backend().download_f32(out);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isnan(rows[i])) << "id 5, element " << i;
    EXPECT_EQ(rows[3 + i], table.values[3 + i]) << "id 1, element " << i;
    EXPECT_TRUE(std::isnan(rows[6 + i])) << "id -1, element " << i;
  }
}

TEST_P(OpTest, PlaceTokensWritesSampledIdsAndChecksEveryPair) {
  Tensor source = backend().upload_i32(std::vector<int32_t>{7, 8, 9}, {3});
  Tensor tokens = backend().upload_i32(std::vector<int32_t>{1, 2, 3, 4}, {4});
  backend().place_tokens(source, std::vector<int32_t>{3, 0, 1, 2}, tokens);
  std::vector<int32_t> later(4, -1);
  const std::unique_ptr<PendingDownload> pending = backend().download_later(tokens, later.data());
  pending->wait();
  EXPECT_EQ(later, (std::vector<int32_t>{1, 9, 3, 7}));
  EXPECT_THROW(backend().place_tokens(source, std::vector<int32_t>{4, 0}, tokens), Error);  // row 4 of 4
  EXPECT_THROW(backend().place_tokens(source, std::vector<int32_t>{0, 3}, tokens), Error);  // source 3 of 3
  EXPECT_THROW(backend().place_tokens(source, std::vector<int32_t>{0}, tokens), Error);     // half a pair
}

TEST_P(OpTest, RmsNormAndResidualVariant) {
  Random random(3);
  for (auto [rows, hidden] : {std::pair<int64_t, int64_t>{1, 7}, {5, 64}, {3, 129}, {17, 1000}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      const std::vector<float> x = random.normal(rows * hidden, 3.0f), residual = random.normal(rows * hidden);
      const HostWeight w = make_weight(backend(), dtype, {hidden}, random.normal(hidden));
      const float eps = 1e-6f, scale = 0.37f;
      Tensor xt = backend().upload_f32(x, {rows, hidden}), out = backend().alloc(DType::F32, {rows, hidden});
      backend().rms_norm(xt, w.tensor, eps, out);
      const std::vector<double> normed = naive_rms(x, w.values, rows, hidden, eps);
      expect_close(backend().download_f32(out), normed, 1e-5, "rms_norm");

      Tensor r = backend().upload_f32(residual, {rows, hidden});
      backend().add_rms_norm(r, xt, w.tensor, eps, scale);
      std::vector<double> expected(residual.size());
      for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = residual[i] + scale * normed[i];
      expect_close(backend().download_f32(r), expected, 1e-5, "add_rms_norm");
    }
  }
}

// The tensor-parallel all-reduce fused into the sandwich norm: the partials' sum, then add_rms_norm and the next norm;
// bad partials are refused naming the rank.
TEST_P(OpTest, AllReduceAddRmsNormSumsRanksThenNorms) {
  Random random(4);
  const int64_t rows = 3, hidden = 129;
  const float eps = 1e-6f, scale = 0.37f;
  std::vector<double> sum(static_cast<std::size_t>(rows * hidden), 0.0);
  std::vector<Tensor> partials;
  for (int rank = 0; rank < 3; ++rank) {
    const std::vector<float> partial = random.normal(rows * hidden);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += partial[i];
    partials.push_back(backend().upload_f32(partial, {rows, hidden}));
  }
  const std::vector<float> residual = random.normal(rows * hidden), y(sum.begin(), sum.end());
  const HostWeight w = make_weight(backend(), DType::BF16, {hidden}, random.normal(hidden));
  const HostWeight next = make_weight(backend(), DType::BF16, {hidden}, random.normal(hidden));
  Tensor r = backend().upload_f32(residual, {rows, hidden}), out = backend().alloc(DType::F32, {rows, hidden});
  backend().all_reduce_add_rms_norm(partials, r, w.tensor, eps, scale, next.tensor, out);
  const std::vector<double> normed = naive_rms(y, w.values, rows, hidden, eps);
  std::vector<double> expected(residual.size());
  std::vector<float> expected_f32(residual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    expected[i] = residual[i] + scale * normed[i];
    expected_f32[i] = static_cast<float>(expected[i]);
  }
  expect_close(backend().download_f32(r), expected, 1e-5, "residual");
  expect_close(backend().download_f32(out), naive_rms(expected_f32, next.values, rows, hidden, eps), 1e-5, "next norm");

  partials[1] = backend().alloc(DType::F32, {rows, hidden + 1});
  Tensor none;
  try {
    backend().all_reduce_add_rms_norm(partials, r, w.tensor, eps, scale, none, none);
    ADD_FAILURE() << "a partial of the wrong shape was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("partial of rank 1"), std::string::npos) << error.what();
  }
  EXPECT_THROW(backend().all_reduce_add_rms_norm(partials, r, w.tensor, eps, scale, next.tensor, none), Error);
}

TEST_P(OpTest, LinearInEveryStoredDtype) {
  Random random(4);
  struct Shape {
    int64_t rows, in, out;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{3, 17, 5}, Shape{7, 64, 33}, Shape{2, 130, 100}, Shape{33, 256, 7},
                  Shape{1, 5000, 9}}) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      const std::vector<float> x = random.normal(s.rows * s.in);
      const HostWeight w = make_weight(backend(), dtype, {s.out, s.in},
                                       random.normal(s.out * s.in, 1.0f / std::sqrt(static_cast<float>(s.in))));
      Tensor y = backend().alloc(DType::F32, {s.rows, s.out});
      backend().linear(backend().upload_f32(x, {s.rows, s.in}), LinearTensors{w.tensor, {}, {}}, y);
      expect_close(backend().download_f32(y), naive_matmul_wt(x, w.values, s.rows, s.in, s.out), 2e-5,
                   fmt::format("linear {}x{}x{} {}", s.rows, s.in, s.out, dtype_name(dtype)));
    }
  }
}

TEST_P(OpTest, LinearRowsDoNotDependOnBatching) {
  Random random(5);
  const int64_t in = 77, out = 13;
  const std::vector<float> x = random.normal(9 * in);
  const HostWeight w = make_weight(backend(), DType::BF16, {out, in}, random.normal(out * in));
  Tensor all = backend().alloc(DType::F32, {9, out});
  backend().linear(backend().upload_f32(x, {9, in}), LinearTensors{w.tensor, {}, {}}, all);
  const std::vector<float> batched = backend().download_f32(all);
  for (int64_t t = 0; t < 9; ++t) {
    Tensor one = backend().alloc(DType::F32, {1, out});
    backend().linear(backend().upload_f32(std::span(x).subspan(t * in, in), {1, in}), LinearTensors{w.tensor, {}, {}},
                     one);
    const std::vector<float> alone = backend().download_f32(one);
    if (backend().device() == Device::Cpu) {
      for (int64_t o = 0; o < out; ++o) EXPECT_EQ(alone[o], batched[t * out + o]) << "row " << t << " column " << o;
    } else {
      // On CUDA one row and nine take different GEMM kernels (cuBLAS picks its tiling, hence its summation order,
      // by the row count; few rows may stream the weights instead), so the rows agree at the tolerance of the GEMMs'
      // split BF16 operands, not bit for bit (as in vLLM, whose batched rows are not batch-invariant either).
      const std::vector<double> expected(batched.begin() + t * out, batched.begin() + (t + 1) * out);
      expect_close(alone, expected, gemm_tolerance(backend()), fmt::format("row {} alone against batched", t));
    }
  }
}

// In batch-invariant mode every backend computes a row alone and among others bit for bit (the full per-op cases are
// the op harness's batch_invariance group).
TEST_P(OpTest, LinearRowsAreBitIdenticalInBatchInvariantMode) {
  ASSERT_TRUE(backend().set_batch_invariant(true));
  backend().set_compute_dtype(ComputeDType::BFloat16);
  Random random(6);
  for (const int64_t in : {77, 520}) {
    const int64_t out = 13, rows = 9;
    const std::vector<float> x = random.normal(rows * in);
    const HostWeight w = make_weight(backend(), DType::BF16, {out, in},
                                     random.normal(out * in, 1.0f / std::sqrt(static_cast<float>(in))));
    Tensor all = backend().alloc(DType::F32, {rows, out});
    backend().linear(backend().upload_f32(x, {rows, in}), LinearTensors{w.tensor, {}, {}}, all);
    const std::vector<float> batched = backend().download_f32(all);
    const std::vector<double> exact = naive_matmul_wt(x, w.values, rows, in, out);
    expect_close(batched, exact, 1e-5, fmt::format("in {}: batched rows against the exact products", in));
    for (int64_t t = 0; t < rows; ++t) {
      Tensor one = backend().alloc(DType::F32, {1, out});
      backend().linear(backend().upload_f32(std::span(x).subspan(t * in, in), {1, in}), LinearTensors{w.tensor, {}, {}},
                       one);
      const std::vector<float> alone = backend().download_f32(one);
      for (int64_t o = 0; o < out; ++o)
        EXPECT_EQ(alone[o], batched[t * out + o]) << "in " << in << " row " << t << " column " << o;
    }
  }
}

TEST_P(OpTest, LinearManyEqualsOneLinearPerWeight) {
  Random random(11);
  for (auto [rows, in] : {std::pair<int64_t, int64_t>{1, 64}, {5, 520}, {3, 77}, {40, 64}}) {
    const std::vector<float> x = random.normal(rows * in);
    const Tensor xt = backend().upload_f32(x, {rows, in});
    std::vector<HostWeight> weights;
    std::vector<LinearTensors> linears;
    std::vector<Tensor> ys;
    for (int64_t out : {48, 8, 13}) {
      weights.push_back(make_weight(backend(), DType::BF16, {out, in},
                                    random.normal(out * in, 1.0f / std::sqrt(static_cast<float>(in)))));
      linears.push_back({weights.back().tensor, {}, {}});
      ys.push_back(backend().alloc(DType::F32, {rows, out}));
    }
    const std::vector<const LinearTensors*> list{&linears[0], &linears[1], &linears[2]};
    const std::vector<Tensor*> outputs{&ys[0], &ys[1], &ys[2]};
    backend().linear_many(xt, list, outputs);
    for (std::size_t i = 0; i < ys.size(); ++i)
      expect_close(backend().download_f32(ys[i]), naive_matmul_wt(x, weights[i].values, rows, in, ys[i].dim(1)), 2e-5,
                   fmt::format("linear_many {} rows, in {}, output {}", rows, in, i));
  }
}

TEST_P(OpTest, RopeRotatesHalvesByPosition) {
  Random random(6);
  for (auto [heads, dim] : {std::pair<int32_t, int32_t>{1, 2}, {3, 16}, {4, 128}, {5, 6}}) {
    const int64_t rows = 6;
    const std::vector<float> x = random.normal(rows * heads * dim);
    const std::vector<int32_t> positions{0, 1, 7, 511, 4096, 100000};
    const double theta = 10000.0;
    Tensor xt = backend().upload_f32(x, {rows, int64_t{heads} * dim});
    backend().rope(xt, backend().upload_i32(positions, {rows}), heads, dim, static_cast<float>(theta));
    std::vector<double> expected(x.size());
    const int32_t half = dim / 2;
    for (int64_t t = 0; t < rows; ++t)
      for (int32_t h = 0; h < heads; ++h)
        for (int32_t j = 0; j < half; ++j) {
          const double angle = positions[t] * std::pow(theta, -2.0 * j / dim);
          const std::size_t base = static_cast<std::size_t>((t * heads + h) * dim);
          const double a = x[base + j], b = x[base + j + half];
          expected[base + j] = a * std::cos(angle) - b * std::sin(angle);
          expected[base + j + half] = b * std::cos(angle) + a * std::sin(angle);
        }
    expect_close(backend().download_f32(xt), expected, 1e-5, fmt::format("rope {}x{}", heads, dim));
  }
}

TEST_P(OpTest, SsmaxScalesQueriesByPosition) {
  Random random(7);
  const int64_t rows = 5, width = 24;
  const std::vector<float> q = random.normal(rows * width);
  const std::vector<int32_t> positions{0, 1, 2047, 2048, 1000000};
  Tensor qt = backend().upload_f32(q, {rows, width});
  backend().ssmax_scale(qt, backend().upload_i32(positions, {rows}), 2048.0f, 0.1f);
  std::vector<double> expected(q.size());
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < width; ++i)
      expected[t * width + i] = q[t * width + i] * std::pow(1.0 + positions[t] / 2048.0, 0.1);
  expect_close(backend().download_f32(qt), expected, 1e-6, "ssmax");
}

std::vector<double> naive_swiglu(const std::vector<float>& x, int64_t rows, int64_t hidden, int64_t inter,
                                 const HostWeight& gate, const HostWeight& up, const HostWeight& down) {
  const std::vector<double> g = naive_matmul_wt(x, gate.values, rows, hidden, inter),
                            u = naive_matmul_wt(x, up.values, rows, hidden, inter);
  std::vector<float> act(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) act[i] = static_cast<float>(g[i] / (1.0 + std::exp(-g[i])) * u[i]);
  return naive_matmul_wt(act, down.values, rows, inter, hidden);
}

struct HostExpert {
  HostWeight gate, up, down;
  SwigluTensors tensors() const { return {{gate.tensor, {}, {}}, {up.tensor, {}, {}}, {down.tensor, {}, {}}}; }
};

HostExpert make_expert(Backend& backend, Random& random, int64_t hidden, int64_t inter, DType dtype) {
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(hidden)),
              out_scale = 1.0f / std::sqrt(static_cast<float>(inter));
  return {make_weight(backend, dtype, {inter, hidden}, random.normal(inter * hidden, in_scale)),
          make_weight(backend, dtype, {inter, hidden}, random.normal(inter * hidden, in_scale)),
          make_weight(backend, dtype, {hidden, inter}, random.normal(hidden * inter, out_scale))};
}

TEST_P(OpTest, DenseSwiglu) {
  Random random(8);
  for (auto [rows, hidden, inter] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 16}, {5, 33, 70}, {12, 64, 128}}) {
    const HostExpert mlp = make_expert(backend(), random, hidden, inter, DType::BF16);
    const std::vector<float> x = random.normal(rows * hidden);
    Tensor out = backend().alloc(DType::F32, {rows, hidden});
    backend().swiglu(backend().upload_f32(x, {rows, hidden}), mlp.tensors(), out);
    expect_close(backend().download_f32(out), naive_swiglu(x, rows, hidden, inter, mlp.gate, mlp.up, mlp.down), 1e-4,
                 "swiglu");
  }
}

TEST_P(OpTest, MoeCombinesWeightedExperts) {
  Random random(9);
  const int64_t hidden = 24, inter = 40, experts = 6;
  for (auto [rows, top_k] : {std::pair<int64_t, int64_t>{1, 2}, {7, 3}, {20, 1}, {9, 6}}) {
    MoeTensors moe;
    std::vector<HostExpert> host;
    for (int64_t e = 0; e < experts; ++e) {
      host.push_back(make_expert(backend(), random, hidden, inter, DType::BF16));
      moe.experts.push_back(host.back().tensors());
    }
    backend().prepare_moe(moe);
    const std::vector<float> x = random.normal(rows * hidden), weights = random.normal(rows * top_k);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<int32_t> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), random.engine());
      ids.insert(ids.end(), order.begin(), order.begin() + top_k);
    }
    Tensor out = backend().alloc(DType::F32, {rows, hidden});
    backend().moe(backend().upload_f32(x, {rows, hidden}), backend().upload_i32(ids, {rows, top_k}),
                  backend().upload_f32(weights, {rows, top_k}), moe, out);
    std::vector<double> expected(static_cast<std::size_t>(rows * hidden), 0.0);
    for (int64_t t = 0; t < rows; ++t) {
      const std::vector<float> row(x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
      for (int64_t j = 0; j < top_k; ++j) {
        const HostExpert& e = host[ids[t * top_k + j]];
        const std::vector<double> y = naive_swiglu(row, 1, hidden, inter, e.gate, e.up, e.down);
        for (int64_t i = 0; i < hidden; ++i) expected[t * hidden + i] += weights[t * top_k + j] * y[i];
      }
    }
    expect_close(backend().download_f32(out), expected, 1e-4, fmt::format("moe rows {} top_k {}", rows, top_k));
  }
}

TEST_P(OpTest, LmHeadNormsSelectedRowsAndSoftCaps) {
  Random random(10);
  const int64_t rows = 6, hidden = 40, vocab = 103;
  const std::vector<float> x = random.normal(rows * hidden);
  const HostWeight norm = make_weight(backend(), DType::BF16, {hidden}, random.normal(hidden));
  const HostWeight head = make_weight(backend(), DType::BF16, {vocab, hidden}, random.normal(vocab * hidden, 2.0f));
  const std::vector<int32_t> selected{5, 0, 3};
  for (float cap : {30.0f, 0.0f}) {
    Tensor logits = backend().alloc(DType::F32, {3, vocab});
    backend().lm_head(backend().upload_f32(x, {rows, hidden}), backend().upload_i32(selected, {3}), norm.tensor, 1e-6f,
                      LinearTensors{head.tensor, {}, {}}, cap, logits);
    const std::vector<double> normed = naive_rms(x, norm.values, rows, hidden, 1e-6);
    std::vector<double> expected;
    for (int32_t row : selected)
      for (int64_t v = 0; v < vocab; ++v) {
        double sum = 0;
        for (int64_t i = 0; i < hidden; ++i) sum += normed[row * hidden + i] * head.values[v * hidden + i];
        expected.push_back(cap > 0 ? cap * std::tanh(sum / cap) : sum);
      }
    // Three rows: more than the CUDA backend streams, so its cuBLAS path (gemm_tolerance).
    expect_close(backend().download_f32(logits), expected, gemm_tolerance(backend()), fmt::format("lm_head cap {}", cap));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, OpTest, ::testing::ValuesIn(backend_names()));

}  // namespace
}  // namespace beamline::testing

// The CPU backend's ops on quantized weights (docs/model-format.md §5): each op on FP8 block-128, MXFP8 and NVFP4
// weights must equal the same op on the F32 matrix of their exact dequantization (quant/quantize.h), bit for bit
// (the CPU backend dequantizes and then runs the same FP32 dots), and that F32 result must match a float64 loop.
// Sizes cut the scale blocks at the edges (out and in not multiples of 128/32/16), and the weights' magnitudes vary
// by row and column band so that a scale read from the wrong block changes the result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/dequantize.h"
#include "backend_test_support.h"
#include "quant/quantize.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

struct QuantizedCase {
  QuantScheme scheme;
  int64_t out, in;
};

// A quantized weight on the backend, and the F32 weight of its exact dequantization.
struct QuantizedPair {
  LinearTensors quantized, dequantized;
  std::vector<float> values;  // the dequantized matrix, [out, in]
};

std::vector<float> banded_values(Random& random, int64_t out, int64_t in) {
  std::vector<float> values = random.normal(static_cast<std::size_t>(out * in));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c)
      values[static_cast<std::size_t>(r * in + c)] *= std::ldexp(1.0f, static_cast<int>((r / 7 + c / 16) % 9) - 4);
  return values;
}

QuantizedPair make_pair(Backend& backend, Random& random, QuantScheme scheme, int64_t out, int64_t in) {
  const QuantizedWeight weight = quantize_weight(scheme, banded_values(random, out, in), out, in);
  const QuantLayout layout = quant_layout(scheme, out, in);
  QuantizedPair pair;
  pair.quantized.weight = backend.upload(weight.codes.data(), layout.weight_dtype, layout.weight_shape);
  pair.quantized.scale = backend.upload(weight.scales.data(), layout.scale_dtype, layout.scale_shape);
  if (layout.has_scale_2) pair.quantized.scale_2 = backend.upload(&weight.scale_2, DType::F32, {});
  pair.values = dequantize_weight(weight.view());
  pair.dequantized.weight = backend.upload_f32(pair.values, {out, in});
  return pair;
}

std::vector<double> naive_linear(const std::vector<float>& x, int64_t rows, const std::vector<float>& w, int64_t out,
                                 int64_t in) {
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int64_t c = 0; c < in; ++c) sum += double{x[t * in + c]} * w[o * in + c];
      y[t * out + o] = sum;
    }
  return y;
}

void expect_equal(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i)
    ASSERT_EQ(actual[i], expected[i]) << what << ": element " << i;
}

std::string case_name(const QuantizedCase& c) {
  return std::string(quant_scheme_name(c.scheme)) + "_" + std::to_string(c.out) + "x" + std::to_string(c.in);
}

class QuantizedLinearTest : public ::testing::TestWithParam<QuantizedCase> {
 protected:
  CpuBackend backend_;
  Random random_{14};
};

TEST_P(QuantizedLinearTest, LinearEqualsTheDequantizedWeight) {
  const auto [scheme, out, in] = GetParam();
  const QuantizedPair pair = make_pair(backend_, random_, scheme, out, in);
  for (int64_t rows : {1, 5}) {
    const std::vector<float> x_host = random_.normal(static_cast<std::size_t>(rows * in));
    const Tensor x = backend_.upload_f32(x_host, {rows, in});
    Tensor y = backend_.alloc(DType::F32, {rows, out}), reference = backend_.alloc(DType::F32, {rows, out});
    backend_.linear(x, pair.quantized, y);
    backend_.linear(x, pair.dequantized, reference);
    expect_equal(backend_.download_f32(y), backend_.download_f32(reference), "linear rows " + std::to_string(rows));
    expect_close(backend_.download_f32(y), naive_linear(x_host, rows, pair.values, out, in), 1e-4, "float64 loop");
  }
}

TEST_P(QuantizedLinearTest, LinearManyAndLmHeadEqualTheDequantizedWeights) {
  const auto [scheme, out, in] = GetParam();
  const QuantizedPair first = make_pair(backend_, random_, scheme, out, in);
  const QuantizedPair second = make_pair(backend_, random_, scheme, out + 3, in);
  const int64_t rows = 3;
  const Tensor x = backend_.upload_f32(random_.normal(static_cast<std::size_t>(rows * in)), {rows, in});
  Tensor y1 = backend_.alloc(DType::F32, {rows, out}), y2 = backend_.alloc(DType::F32, {rows, out + 3});
  const LinearTensors* weights[] = {&first.quantized, &second.quantized};
  Tensor* ys[] = {&y1, &y2};
  backend_.linear_many(x, weights, ys);
  Tensor r1 = backend_.alloc(DType::F32, {rows, out}), r2 = backend_.alloc(DType::F32, {rows, out + 3});
  backend_.linear(x, first.dequantized, r1);
  backend_.linear(x, second.dequantized, r2);
  expect_equal(backend_.download_f32(y1), backend_.download_f32(r1), "linear_many first");
  expect_equal(backend_.download_f32(y2), backend_.download_f32(r2), "linear_many second");

  const Tensor norm = backend_.upload_f32(random_.normal(static_cast<std::size_t>(in)), {in});
  const std::vector<int32_t> selected = {2, 0};
  const Tensor logit_rows = backend_.upload_i32(selected, {2});
  Tensor logits = backend_.alloc(DType::F32, {2, out}), reference = backend_.alloc(DType::F32, {2, out});
  backend_.lm_head(x, logit_rows, norm, 1e-6f, first.quantized, 30.0f, logits);
  backend_.lm_head(x, logit_rows, norm, 1e-6f, first.dequantized, 30.0f, reference);
  expect_equal(backend_.download_f32(logits), backend_.download_f32(reference), "lm_head");
}

// out x in read as the hidden x intermediate sizes of a SwiGLU, so gate/up are [in, out] and down [out, in].
TEST_P(QuantizedLinearTest, SwigluAndMoeEqualTheDequantizedExperts) {
  const auto [scheme, hidden_rows, intermediate] = GetParam();
  // Every projection's input width must fit the scheme (mxfp8 and nvfp4: a multiple of their group).
  const int64_t hidden = intermediate,
                inter = scheme == QuantScheme::Fp8Block ? hidden_rows : intermediate + quant_group_size(scheme);
  SwigluTensors quantized[3], dequantized[3];
  for (int e = 0; e < 3; ++e) {
    QuantizedPair gate = make_pair(backend_, random_, scheme, inter, hidden);
    QuantizedPair up = make_pair(backend_, random_, scheme, inter, hidden);
    QuantizedPair down = make_pair(backend_, random_, scheme, hidden, inter);
    quantized[e] = {gate.quantized, up.quantized, down.quantized};
    dequantized[e] = {gate.dequantized, up.dequantized, down.dequantized};
  }
  const int64_t rows = 4;
  const Tensor h = backend_.upload_f32(random_.normal(static_cast<std::size_t>(rows * hidden)), {rows, hidden});
  Tensor out = backend_.alloc(DType::F32, {rows, hidden}), reference = backend_.alloc(DType::F32, {rows, hidden});
  backend_.swiglu(h, quantized[1], out);
  backend_.swiglu(h, dequantized[1], reference);
  expect_equal(backend_.download_f32(out), backend_.download_f32(reference), "swiglu");

  MoeTensors moe_quantized, moe_dequantized;
  moe_quantized.experts.assign(std::begin(quantized), std::end(quantized));
  moe_dequantized.experts.assign(std::begin(dequantized), std::end(dequantized));
  const Tensor ids = backend_.upload_i32(std::vector<int32_t>{0, 2, 1, 0, 2, 1, 0, 1}, {rows, 2});
  const Tensor weights = backend_.upload_f32(std::vector<float>{0.7f, 0.3f, 1.5f, 0.5f, 1.0f, 1.0f, 0.2f, 2.3f}, {rows, 2});
  backend_.moe(h, ids, weights, moe_quantized, out);
  backend_.moe(h, ids, weights, moe_dequantized, reference);
  expect_equal(backend_.download_f32(out), backend_.download_f32(reference), "moe");
}

INSTANTIATE_TEST_SUITE_P(Layouts, QuantizedLinearTest,
                         ::testing::Values(QuantizedCase{QuantScheme::Fp8Block, 200, 160},
                                           QuantizedCase{QuantScheme::Fp8Block, 130, 300},
                                           QuantizedCase{QuantScheme::Fp8Block, 3, 40},
                                           QuantizedCase{QuantScheme::Mxfp8, 77, 96},
                                           QuantizedCase{QuantScheme::Mxfp8, 5, 32},
                                           QuantizedCase{QuantScheme::Nvfp4, 45, 80},
                                           QuantizedCase{QuantScheme::Nvfp4, 3, 16}),
                         [](const ::testing::TestParamInfo<QuantizedCase>& info) { return case_name(info.param); });

// The CPU backend's vectorised dequantization equals quant/quantize.h's reference bit for bit (NaN for NaN), over
// every code, NaN codes included, and scales from the smallest to the largest an E8M0 or E4M3 code or an F32 holds.
TEST(CpuDequantize, EqualsTheReferenceOverEveryCodeAndScale) {
  std::mt19937_64 engine(9);
  std::uniform_int_distribution<int> byte(0, 255);
  for (QuantScheme scheme : {QuantScheme::Fp8Block, QuantScheme::Mxfp8, QuantScheme::Nvfp4}) {
    const int64_t out = 131, in = scheme == QuantScheme::Fp8Block ? 300 : 96;
    const QuantLayout layout = quant_layout(scheme, out, in);
    std::vector<uint8_t> codes(static_cast<std::size_t>(layout.weight_shape[0] * layout.weight_shape[1]));
    for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i < 256 ? i : byte(engine));
    std::vector<uint8_t> scales(static_cast<std::size_t>(layout.scale_shape[0] * layout.scale_shape[1]) *
                                dtype_size(layout.scale_dtype));
    for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(i < 256 ? i : byte(engine));
    if (scheme == QuantScheme::Fp8Block) {  // F32 scales: extremes first, then random magnitudes
      const float extremes[] = {3.0e38f, 1.0e-40f, 0.0f, 1.0f, 2.5e-3f, 7.0e36f, 1.0e-30f, 448.0f};
      for (std::size_t i = 0; i < scales.size() / 4; ++i) {
        const float scale = i < 8 ? extremes[i] : std::ldexp(1.3f, byte(engine) / 2 - 64);
        std::memcpy(scales.data() + 4 * i, &scale, 4);
      }
    }
    for (float scale_2 : {1.0f, 3.7e-5f, 1.0e30f}) {
      const QuantizedWeightView view{scheme, out, in, codes.data(), scales.data(), scale_2};
      const std::vector<float> expected = dequantize_weight(view);
      std::vector<float> actual(expected.size());
      cpu::dequantize_weight_rows(view, 0, out, actual.data());
      for (std::size_t i = 0; i < expected.size(); ++i) {
        if (std::isnan(expected[i])) {
          ASSERT_TRUE(std::isnan(actual[i])) << quant_scheme_name(scheme) << " element " << i;
        } else {
          ASSERT_EQ(std::memcmp(&actual[i], &expected[i], 4), 0)
              << quant_scheme_name(scheme) << " element " << i << ": " << actual[i] << " vs " << expected[i];
        }
      }
    }
  }
}

// A malformed quantized weight is refused by the op with a message naming what was expected.
void expect_refused(Backend& backend, const LinearTensors& weight, int64_t in, const std::string& expected_text) {
  const Tensor x = backend.upload_f32(std::vector<float>(static_cast<std::size_t>(in), 1.0f), {1, in});
  Tensor y = backend.alloc(DType::F32, {1, weight.weight.dim(0)});
  try {
    backend.linear(x, weight, y);
    FAIL() << "accepted a malformed weight; expected an error containing \"" << expected_text << "\"";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(expected_text), std::string::npos) << error.what();
  }
}

TEST(QuantizedWeightChecks, MalformedLayoutsAreRefused) {
  CpuBackend backend;
  Random random(3);
  QuantizedPair fp8 = make_pair(backend, random, QuantScheme::Fp8Block, 130, 256);
  LinearTensors wrong_shape = fp8.quantized;
  wrong_shape.scale = backend.upload_f32(std::vector<float>(2, 1.0f), {1, 2});
  expect_refused(backend, wrong_shape, 256, "needs scale [2, 2]");

  LinearTensors no_scale = fp8.quantized;
  no_scale.scale = Tensor();
  expect_refused(backend, no_scale, 256, "with no scale tensor");

  QuantizedPair nvfp4 = make_pair(backend, random, QuantScheme::Nvfp4, 8, 32);
  LinearTensors no_scale_2 = nvfp4.quantized;
  no_scale_2.scale_2 = Tensor();
  expect_refused(backend, no_scale_2, 32, "needs an F32 scalar scale_2");

  LinearTensors wrong_dtype = nvfp4.quantized;
  wrong_dtype.scale = backend.upload_f32(std::vector<float>(16, 1.0f), {8, 2});
  expect_refused(backend, wrong_dtype, 32, "none of the quantized layouts");

  QuantizedPair mxfp8 = make_pair(backend, random, QuantScheme::Mxfp8, 4, 64);
  LinearTensors wrong_group = mxfp8.quantized;
  wrong_group.scale = backend.upload(std::vector<uint8_t>(16, 127).data(), DType::F8_E8M0, {4, 4});
  expect_refused(backend, wrong_group, 64, "needs scale [4, 2]");
}

}  // namespace
}  // namespace beamline::testing

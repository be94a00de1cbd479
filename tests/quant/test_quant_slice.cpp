// One rank's part of a quantized weight (quant/slice.h): for every scheme and every part the layout can hold,
// dequantize(part) == the part of dequantize(whole), bit for bit, with scale tensors shaped for the part's own shape;
// parts that would split a scale group, or start inside an fp8 block and run past it, are refused naming why.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/quantize.h"
#include "quant/slice.h"
#include "quant_test_support.h"
#include "util/error.h"

namespace beamline {
namespace {

QuantizedWeight random_weight(QuantScheme scheme, int64_t out, int64_t in, uint64_t seed) {
  std::mt19937_64 engine(seed);
  const std::vector<float> values = testing::wide_values(engine, static_cast<std::size_t>(out * in), -4, 2);
  return quantize_weight(scheme, values, out, in);
}

// The part [begin, begin + count) along `axis` of the row-major [out, in] matrix `values`.
std::vector<float> part_of(const std::vector<float>& values, int64_t out, int64_t in, SliceAxis axis, int64_t begin,
                           int64_t count) {
  std::vector<float> part;
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c)
      if ((axis == SliceAxis::Rows ? r : c) >= begin && (axis == SliceAxis::Rows ? r : c) < begin + count)
        part.push_back(values[static_cast<std::size_t>(r * in + c)]);
  return part;
}

void expect_bitwise_equal(const std::vector<float>& actual, const std::vector<float>& expected,
                          const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(actual[i]), std::bit_cast<uint32_t>(expected[i])) << what << " at " << i;
}

// Every uniform split of `extent` into parts of `count` (every rank's part) along `axis`, checked.
void check_parts(QuantScheme scheme, int64_t out, int64_t in, SliceAxis axis, int64_t count) {
  const QuantizedWeight whole = random_weight(scheme, out, in, static_cast<uint64_t>(out * 1000 + in + count));
  const std::vector<float> reference = dequantize_weight(whole.view());
  const int64_t extent = axis == SliceAxis::Rows ? out : in;
  for (int64_t begin = 0; begin < extent; begin += count) {
    const std::string what = std::string(quant_scheme_name(scheme)) +
                             (axis == SliceAxis::Rows ? " rows " : " columns ") + std::to_string(begin) + "+" +
                             std::to_string(count) + " of [" + std::to_string(out) + ", " + std::to_string(in) + "]";
    ASSERT_EQ(quantized_slice_problem(scheme, out, in, axis, begin, count), "") << what;
    const std::vector<float> expected = part_of(reference, out, in, axis, begin, count);
    if (axis == SliceAxis::Rows) {
      const QuantizedWeightView part = quantized_rows(whole.view(), begin, count);
      EXPECT_EQ(part.out_features, count);
      EXPECT_EQ(part.in_features, in);
      expect_bitwise_equal(dequantize_weight(part), expected, what);
    } else {
      const QuantizedWeight part = quantized_columns(whole.view(), begin, count);
      const QuantLayout layout = quant_layout(scheme, out, count);
      EXPECT_EQ(part.codes.size(), static_cast<std::size_t>(layout.weight_shape[0] * layout.weight_shape[1])) << what;
      EXPECT_EQ(part.scales.size(), static_cast<std::size_t>(layout.scale_shape[0] * layout.scale_shape[1]) *
                                        dtype_size(layout.scale_dtype)) << what;
      EXPECT_EQ(part.scale_2, whole.scale_2) << what;
      expect_bitwise_equal(dequantize_weight(part.view()), expected, what);
    }
  }
}

TEST(QuantSlice, Fp8PartsAlignedToBlocks) {
  check_parts(QuantScheme::Fp8Block, 512, 384, SliceAxis::Rows, 128);
  check_parts(QuantScheme::Fp8Block, 512, 384, SliceAxis::Rows, 256);
  check_parts(QuantScheme::Fp8Block, 384, 512, SliceAxis::Columns, 128);
  check_parts(QuantScheme::Fp8Block, 384, 512, SliceAxis::Columns, 256);
}

TEST(QuantSlice, Fp8PartsInsideOneBlockKeepItsScale) {
  check_parts(QuantScheme::Fp8Block, 128, 64, SliceAxis::Rows, 16);   // tiny's q_proj at TP8: a block shared by 8 ranks
  check_parts(QuantScheme::Fp8Block, 256, 96, SliceAxis::Rows, 64);   // two ranks per block
  check_parts(QuantScheme::Fp8Block, 64, 128, SliceAxis::Columns, 32);
  check_parts(QuantScheme::Fp8Block, 96, 256, SliceAxis::Columns, 64);
}

TEST(QuantSlice, Fp8WholeBlocksWithAShortLastBlock) {
  // Parts that start on a block and end at the weight's edge (a short last block), or inside a block (as the first of
  // parts that are not whole blocks would; the later ones are refused, below).
  const QuantizedWeight whole = random_weight(QuantScheme::Fp8Block, 200, 300, 7);
  const std::vector<float> reference = dequantize_weight(whole.view());
  expect_bitwise_equal(dequantize_weight(quantized_rows(whole.view(), 128, 72)),
                       part_of(reference, 200, 300, SliceAxis::Rows, 128, 72), "rows 128+72");
  expect_bitwise_equal(dequantize_weight(quantized_columns(whole.view(), 256, 44).view()),
                       part_of(reference, 200, 300, SliceAxis::Columns, 256, 44), "columns 256+44");
  expect_bitwise_equal(dequantize_weight(quantized_columns(whole.view(), 0, 160).view()),
                       part_of(reference, 200, 300, SliceAxis::Columns, 0, 160), "columns 0+160");
}

TEST(QuantSlice, Mxfp8AnyRowsAndWholeGroupsOfColumns) {
  check_parts(QuantScheme::Mxfp8, 96, 64, SliceAxis::Rows, 1);
  check_parts(QuantScheme::Mxfp8, 96, 64, SliceAxis::Rows, 24);
  check_parts(QuantScheme::Mxfp8, 48, 256, SliceAxis::Columns, 32);
  check_parts(QuantScheme::Mxfp8, 48, 256, SliceAxis::Columns, 64);
}

TEST(QuantSlice, Nvfp4AnyRowsAndWholeGroupsOfColumns) {
  check_parts(QuantScheme::Nvfp4, 96, 64, SliceAxis::Rows, 3);
  check_parts(QuantScheme::Nvfp4, 96, 64, SliceAxis::Rows, 48);
  check_parts(QuantScheme::Nvfp4, 48, 128, SliceAxis::Columns, 16);
  check_parts(QuantScheme::Nvfp4, 48, 128, SliceAxis::Columns, 32);
}

TEST(QuantSlice, RowPartsAreViewsIntoTheWhole) {
  const QuantizedWeight whole = random_weight(QuantScheme::Nvfp4, 64, 32, 3);
  const QuantizedWeightView part = quantized_rows(whole.view(), 16, 16);
  EXPECT_EQ(part.codes, whole.codes.data() + 16 * 16);
  EXPECT_EQ(part.scales, whole.scales.data() + 16 * 2);
  EXPECT_EQ(part.scale_2, whole.scale_2);
}

TEST(QuantSlice, RefusesPartsTheLayoutCannotHold) {
  // fp8: rows [96, 192) start inside block 0 and run into block 1 (moe_intermediate 192 at TP2).
  EXPECT_NE(quantized_slice_problem(QuantScheme::Fp8Block, 192, 64, SliceAxis::Rows, 96, 96).find("128x128"),
            std::string::npos);
  EXPECT_EQ(quantized_slice_problem(QuantScheme::Fp8Block, 192, 64, SliceAxis::Rows, 0, 96), "");
  // mxfp8 and nvfp4: a column part that is not whole groups (tiny's expert down_proj at TP2: 16 of 32 columns).
  EXPECT_NE(quantized_slice_problem(QuantScheme::Mxfp8, 64, 32, SliceAxis::Columns, 16, 16).find("32 elements"),
            std::string::npos);
  EXPECT_NE(quantized_slice_problem(QuantScheme::Nvfp4, 64, 32, SliceAxis::Columns, 8, 8).find("16 elements"),
            std::string::npos);
  EXPECT_EQ(quantized_slice_problem(QuantScheme::Nvfp4, 64, 32, SliceAxis::Rows, 7, 9), "");
  EXPECT_NE(quantized_slice_problem(QuantScheme::Mxfp8, 64, 32, SliceAxis::Rows, 60, 8).find("outside"),
            std::string::npos);
  const QuantizedWeight whole = random_weight(QuantScheme::Mxfp8, 64, 64, 5);
  EXPECT_THROW(quantized_columns(whole.view(), 16, 32), Error);
  const QuantizedWeight fp8 = random_weight(QuantScheme::Fp8Block, 192, 64, 5);
  EXPECT_THROW(quantized_rows(fp8.view(), 96, 96), Error);
}

}  // namespace
}  // namespace beamline

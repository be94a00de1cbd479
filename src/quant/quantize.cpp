#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/element_codes.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace beamline {
namespace {

float block_amax(const float* values, int64_t rows, int64_t row_stride, int64_t columns) {
  float amax = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < columns; ++c) amax = std::max(amax, std::fabs(values[r * row_stride + c]));
  return amax;
}

void require_finite(std::span<const float> values, int64_t in_features) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      fail("quantize: the weight's element [{}, {}] is {} (only finite weights can be quantized)",
           static_cast<int64_t>(i) / in_features, static_cast<int64_t>(i) % in_features, values[i]);
}

void quantize_fp8_block(const float* values, int64_t rows, int64_t in, QuantizedWeight& result) {
  const int64_t block_columns = (in + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t block_rows = (rows + kFp8BlockSize - 1) / kFp8BlockSize;
  std::vector<float> scales(static_cast<std::size_t>(block_rows * block_columns));
  for (int64_t br = 0; br < block_rows; ++br)
    for (int64_t bc = 0; bc < block_columns; ++bc) {
      const int64_t r0 = br * kFp8BlockSize, c0 = bc * kFp8BlockSize;
      const int64_t height = std::min(kFp8BlockSize, rows - r0), width = std::min(kFp8BlockSize, in - c0);
      const float scale = e4m3_scale_for_amax(block_amax(values + r0 * in + c0, height, in, width));
      scales[static_cast<std::size_t>(br * block_columns + bc)] = scale;
      for (int64_t r = r0; r < r0 + height; ++r)
        for (int64_t c = c0; c < c0 + width; ++c)
          result.codes[static_cast<std::size_t>(r * in + c)] = f32_to_e4m3(values[r * in + c] / scale);
    }
  result.scales.resize(scales.size() * sizeof(float));
  std::memcpy(result.scales.data(), scales.data(), result.scales.size());
}

void quantize_mxfp8(const float* values, int64_t rows, int64_t in, QuantizedWeight& result) {
  const int64_t groups = in / kMxfp8GroupSize;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* group = values + r * in + g * kMxfp8GroupSize;
      const uint8_t exponent = e8m0_for_amax(block_amax(group, 1, 0, kMxfp8GroupSize), kE4M3Max);
      result.scales[static_cast<std::size_t>(r * groups + g)] = exponent;
      uint8_t* codes = result.codes.data() + r * in + g * kMxfp8GroupSize;
      for (int64_t i = 0; i < kMxfp8GroupSize; ++i) codes[i] = f32_to_e4m3(std::ldexp(group[i], 127 - exponent));
    }
}

void quantize_nvfp4(const float* values, int64_t rows, int64_t in, QuantizedWeight& result) {
  const int64_t groups = in / kNvfp4GroupSize;
  const float scale_2 = result.scale_2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* group = values + r * in + g * kNvfp4GroupSize;
      const uint8_t scale_code =
          f32_to_e4m3(block_amax(group, 1, 0, kNvfp4GroupSize) / (kE2M1Max * scale_2));
      result.scales[static_cast<std::size_t>(r * groups + g)] = scale_code;
      const float scale = e4m3_table()[scale_code] * scale_2;
      uint8_t* packed = result.codes.data() + (r * in + g * kNvfp4GroupSize) / 2;
      for (int64_t i = 0; i < kNvfp4GroupSize; i += 2) {
        const uint8_t low = scale == 0.0f ? 0 : f32_to_e2m1(group[i] / scale);
        const uint8_t high = scale == 0.0f ? 0 : f32_to_e2m1(group[i + 1] / scale);
        packed[i / 2] = static_cast<uint8_t>(low | (high << 4));
      }
    }
}

float read_f32(const uint8_t* bytes, int64_t index) {
  float value;
  std::memcpy(&value, bytes + index * 4, sizeof value);
  return value;
}

}  // namespace

float weight_amax(std::span<const float> values) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]))
      fail("quantize: element {} of the weight is {} (only finite weights can be quantized)", i, values[i]);
    amax = std::max(amax, std::fabs(values[i]));
  }
  return amax;
}

float nvfp4_scale_2(float tensor_amax) { return std::fmax(tensor_amax, kMinScaledAmax) / (kE4M3Max * kE2M1Max); }

QuantizedWeight quantize_weight(QuantScheme scheme, std::span<const float> values, int64_t out_features,
                                int64_t in_features) {
  require(out_features > 0 && in_features > 0 && values.size() == static_cast<std::size_t>(out_features * in_features),
          "quantize: {} values for a [{}, {}] weight", values.size(), out_features, in_features);
  require_finite(values, in_features);
  return quantize_weight_rows(scheme, values, out_features, in_features, weight_amax(values));
}

QuantizedWeight quantize_weight_rows(QuantScheme scheme, std::span<const float> values, int64_t rows,
                                     int64_t in_features, float tensor_amax) {
  const QuantLayout layout = quant_layout(scheme, rows, in_features);
  require(values.size() == static_cast<std::size_t>(rows * in_features), "quantize: {} values for {} rows of {}",
          values.size(), rows, in_features);
  require(std::isfinite(tensor_amax) && tensor_amax >= 0.0f, "quantize: tensor amax {} must be finite and >= 0",
          tensor_amax);
  require_finite(values, in_features);
  QuantizedWeight result;
  result.scheme = scheme;
  result.out_features = rows;
  result.in_features = in_features;
  result.codes.resize(static_cast<std::size_t>(layout.weight_shape[0] * layout.weight_shape[1]));
  result.scales.resize(static_cast<std::size_t>(layout.scale_shape[0] * layout.scale_shape[1]) *
                       dtype_size(layout.scale_dtype));
  switch (scheme) {
    case QuantScheme::Fp8Block:
      quantize_fp8_block(values.data(), rows, in_features, result);
      break;
    case QuantScheme::Mxfp8:
      quantize_mxfp8(values.data(), rows, in_features, result);
      break;
    case QuantScheme::Nvfp4:
      result.scale_2 = nvfp4_scale_2(tensor_amax);
      quantize_nvfp4(values.data(), rows, in_features, result);
      break;
  }
  return result;
}

void dequantize_rows(const QuantizedWeightView& weight, int64_t first_row, int64_t count, float* out) {
  const int64_t in = weight.in_features;
  require(first_row >= 0 && count >= 0 && first_row + count <= weight.out_features,
          "dequantize: rows [{}, {}) outside the weight's {} rows", first_row, first_row + count, weight.out_features);
  const std::array<float, 256>& e4m3 = e4m3_table();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = first_row + i;
    float* y = out + i * in;
    switch (weight.scheme) {
      case QuantScheme::Fp8Block: {
        const uint8_t* codes = weight.codes + row * in;
        const int64_t block_columns = (in + kFp8BlockSize - 1) / kFp8BlockSize;
        for (int64_t bc = 0; bc < block_columns; ++bc) {
          const float scale = read_f32(weight.scales, row / kFp8BlockSize * block_columns + bc);
          const int64_t end = std::min(in, (bc + 1) * kFp8BlockSize);
          for (int64_t c = bc * kFp8BlockSize; c < end; ++c) y[c] = e4m3[codes[c]] * scale;
        }
        break;
      }
      case QuantScheme::Mxfp8: {
        const uint8_t* codes = weight.codes + row * in;
        const int64_t groups = in / kMxfp8GroupSize;
        for (int64_t g = 0; g < groups; ++g) {
          const float scale = e8m0_to_f32(weight.scales[row * groups + g]);
          for (int64_t c = g * kMxfp8GroupSize; c < (g + 1) * kMxfp8GroupSize; ++c) y[c] = e4m3[codes[c]] * scale;
        }
        break;
      }
      case QuantScheme::Nvfp4: {
        const std::array<float, 16>& e2m1 = e2m1_table();
        const uint8_t* packed = weight.codes + row * in / 2;
        const int64_t groups = in / kNvfp4GroupSize;
        for (int64_t g = 0; g < groups; ++g) {
          const float scale = e4m3[weight.scales[row * groups + g]];
          for (int64_t c = g * kNvfp4GroupSize; c < (g + 1) * kNvfp4GroupSize; c += 2) {
            const uint8_t byte = packed[c / 2];
            y[c] = (e2m1[byte & 0xf] * scale) * weight.scale_2;
            y[c + 1] = (e2m1[byte >> 4] * scale) * weight.scale_2;
          }
        }
        break;
      }
    }
  }
}

std::vector<float> dequantize_weight(const QuantizedWeightView& weight) {
  std::vector<float> values(static_cast<std::size_t>(weight.out_features * weight.in_features));
  dequantize_rows(weight, 0, weight.out_features, values.data());
  return values;
}

}  // namespace beamline

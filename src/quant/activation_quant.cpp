#include "quant/activation_quant.h"

#include <algorithm>
#include <cmath>

#include "quant/element_codes.h"
#include "util/error.h"

namespace beamline {

void quantize_activation_row(const float* x, int64_t columns, int64_t group_size, uint8_t* codes, float* scales) {
  for (int64_t first = 0, g = 0; first < columns; first += group_size, ++g) {
    const int64_t end = std::min(columns, first + group_size);
    float amax = 0.0f;
    for (int64_t c = first; c < end; ++c) amax = std::fmax(amax, std::fabs(x[c]));
    const float scale = e4m3_scale_for_amax(amax);
    scales[g] = scale;
    for (int64_t c = first; c < end; ++c) codes[c] = f32_to_e4m3(x[c] / scale);
  }
}

QuantizedActivations quantize_activations(std::span<const float> x, int64_t rows, int64_t columns,
                                          int64_t group_size) {
  require(group_size > 0, "quantize_activations: group_size {} must be positive", group_size);
  require(rows >= 0 && columns > 0 && x.size() == static_cast<std::size_t>(rows * columns),
          "quantize_activations: {} values for [{}, {}]", x.size(), rows, columns);
  QuantizedActivations result;
  result.rows = rows;
  result.columns = columns;
  result.group_size = group_size;
  result.codes.resize(x.size());
  result.scales.resize(static_cast<std::size_t>(rows * result.groups_per_row()));
  for (int64_t t = 0; t < rows; ++t)
    quantize_activation_row(x.data() + t * columns, columns, group_size, result.codes.data() + t * columns,
                            result.scales.data() + t * result.groups_per_row());
  return result;
}

std::vector<float> dequantize_activations(const QuantizedActivations& activations) {
  const std::array<float, 256>& e4m3 = e4m3_table();
  std::vector<float> x(activations.codes.size());
  for (int64_t t = 0; t < activations.rows; ++t)
    for (int64_t c = 0; c < activations.columns; ++c) {
      const auto i = static_cast<std::size_t>(t * activations.columns + c);
      x[i] = e4m3[activations.codes[i]] *
             activations.scales[static_cast<std::size_t>(t * activations.groups_per_row() + c / activations.group_size)];
    }
  return x;
}

}  // namespace beamline

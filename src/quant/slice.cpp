#include "quant/slice.h"

#include <fmt/format.h>

#include <cstring>

#include "tensor/dtype.h"
#include "util/error.h"

namespace beamline {
namespace {

// Elements along `axis` that share one scale: 128 for fp8 on both axes, 1 along the rows of the per-row schemes.
int64_t scale_span(QuantScheme scheme, SliceAxis axis) {
  if (scheme == QuantScheme::Fp8Block) return kFp8BlockSize;
  return axis == SliceAxis::Rows ? 1 : quant_group_size(scheme);
}

// Bytes of one row of codes of an [out, in] weight (nvfp4 packs two a byte).
int64_t code_row_bytes(QuantScheme scheme, int64_t in_features) {
  return scheme == QuantScheme::Nvfp4 ? in_features / 2 : in_features;
}

void require_slice(const QuantizedWeightView& weight, SliceAxis axis, int64_t begin, int64_t count) {
  const std::string problem =
      quantized_slice_problem(weight.scheme, weight.out_features, weight.in_features, axis, begin, count);
  require(problem.empty(), "{}", problem);
}

}  // namespace

std::string quantized_slice_problem(QuantScheme scheme, int64_t out_features, int64_t in_features, SliceAxis axis,
                                    int64_t begin, int64_t count) {
  const bool rows = axis == SliceAxis::Rows;
  const int64_t extent = rows ? out_features : in_features, span = scale_span(scheme, axis);
  const std::string what = fmt::format("{} [{}, {}) of a [{}, {}] {} weight", rows ? "rows" : "columns", begin,
                                       begin + count, out_features, in_features, quant_scheme_name(scheme));
  if (begin < 0 || count <= 0 || begin + count > extent) return what + ": outside the weight";
  if (scheme == QuantScheme::Fp8Block) {
    if (begin % span == 0 || begin % span + count <= span) return {};
    return fmt::format("{}: the part starts inside a {}x{} scale block (at {} of it) and runs past its end, so its "
                       "first block would need two scales",
                       what, span, span, begin % span);
  }
  if (begin % span == 0 && count % span == 0) return {};
  return fmt::format("{}: a row's {} elements share one scale, and the part would hold part of a group", what, span);
}

QuantizedWeightView quantized_rows(const QuantizedWeightView& weight, int64_t begin, int64_t count) {
  require_slice(weight, SliceAxis::Rows, begin, count);
  const QuantLayout whole = quant_layout(weight.scheme, weight.out_features, weight.in_features);
  const int64_t scale_row = begin / scale_span(weight.scheme, SliceAxis::Rows);
  const auto scale_row_bytes = static_cast<int64_t>(dtype_size(whole.scale_dtype)) * whole.scale_shape[1];
  return {weight.scheme, count, weight.in_features,
          weight.codes + begin * code_row_bytes(weight.scheme, weight.in_features),
          weight.scales + scale_row * scale_row_bytes, weight.scale_2};
}

QuantizedWeight quantized_columns(const QuantizedWeightView& weight, int64_t begin, int64_t count) {
  require_slice(weight, SliceAxis::Columns, begin, count);
  const QuantScheme scheme = weight.scheme;
  const QuantLayout whole = quant_layout(scheme, weight.out_features, weight.in_features);
  const QuantLayout part = quant_layout(scheme, weight.out_features, count);
  QuantizedWeight result;
  result.scheme = scheme;
  result.out_features = weight.out_features;
  result.in_features = count;
  result.scale_2 = weight.scale_2;

  const int64_t in_bytes = code_row_bytes(scheme, weight.in_features), out_bytes = code_row_bytes(scheme, count);
  const int64_t first_byte = code_row_bytes(scheme, begin);
  result.codes.resize(static_cast<std::size_t>(weight.out_features * out_bytes));
  for (int64_t r = 0; r < weight.out_features; ++r)
    std::memcpy(result.codes.data() + r * out_bytes, weight.codes + r * in_bytes + first_byte,
                static_cast<std::size_t>(out_bytes));

  const auto element = static_cast<int64_t>(dtype_size(whole.scale_dtype));
  const int64_t scale_rows = part.scale_shape[0], whole_columns = whole.scale_shape[1];
  const int64_t part_columns = part.scale_shape[1];
  const int64_t first_column = begin / scale_span(scheme, SliceAxis::Columns);
  result.scales.resize(static_cast<std::size_t>(scale_rows * part_columns * element));
  for (int64_t r = 0; r < scale_rows; ++r)
    std::memcpy(result.scales.data() + r * part_columns * element,
                weight.scales + (r * whole_columns + first_column) * element,
                static_cast<std::size_t>(part_columns * element));
  return result;
}

}  // namespace beamline

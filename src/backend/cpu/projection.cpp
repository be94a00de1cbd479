#include "backend/cpu/projection.h"

#include "util/error.h"

namespace beamline::cpu {
namespace {

bool is_float(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16; }

QuantScheme scheme_of(const LinearTensors& weight, std::string_view op, std::string_view what) {
  const DType codes = weight.weight.dtype(), scales = weight.scale.dtype();
  if (codes == DType::F8_E4M3 && scales == DType::F32) return QuantScheme::Fp8Block;
  if (codes == DType::F8_E4M3 && (scales == DType::F8_E8M0 || scales == DType::U8)) return QuantScheme::Mxfp8;
  if (codes == DType::U8 && scales == DType::F8_E4M3) return QuantScheme::Nvfp4;
  fail("{}: {} {} with scale {} is none of the quantized layouts (F8_E4M3 + F32 block-128 scales, F8_E4M3 + "
       "F8_E8M0 per-32 scales, U8 packed E2M1 + F8_E4M3 per-16 scales + F32 scale_2)",
       op, what, describe(weight.weight), describe(weight.scale));
}

}  // namespace

Projection projection(const LinearTensors& weight, std::string_view op, std::string_view what) {
  require(weight.weight.defined(), "{}: {} is not loaded", op, what);
  require(weight.weight.rank() == 2, "{}: {} must be a matrix, got {}", op, what, describe(weight.weight));
  if (!weight.scale.defined()) {
    require(is_float(weight.weight.dtype()), "{}: {} is {} with no scale tensor, expected F32, BF16 or F16", op, what,
            describe(weight.weight));
    return {weight.weight.dim(0), weight.weight.dim(1), std::nullopt};
  }
  const QuantScheme scheme = scheme_of(weight, op, what);
  const int64_t out = weight.weight.dim(0);
  const int64_t in = scheme == QuantScheme::Nvfp4 ? 2 * weight.weight.dim(1) : weight.weight.dim(1);
  const QuantLayout layout = quant_layout(scheme, out, in);
  require(weight.scale.shape() == layout.scale_shape, "{}: {} {} ({}) needs scale {}, got {}", op, what,
          describe(weight.weight), quant_scheme_name(scheme), shape_string(layout.scale_shape),
          describe(weight.scale));
  float scale_2 = 1.0f;
  if (layout.has_scale_2) {
    require(weight.scale_2.defined() && weight.scale_2.dtype() == DType::F32 && weight.scale_2.numel() == 1,
            "{}: {} (nvfp4) needs an F32 scalar scale_2, got {}", op, what,
            weight.scale_2.defined() ? describe(weight.scale_2) : std::string("none"));
    scale_2 = weight.scale_2.data<const float>()[0];
  } else {
    require(!weight.scale_2.defined(), "{}: {} ({}) has a scale_2 {} that the layout does not use", op, what,
            quant_scheme_name(scheme), describe(weight.scale_2));
  }
  return {out, in,
          QuantizedWeightView{scheme, out, in, weight.weight.data<const uint8_t>(), weight.scale.data<const uint8_t>(),
                              scale_2}};
}

}  // namespace beamline::cpu

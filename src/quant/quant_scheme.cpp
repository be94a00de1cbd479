#include "quant/quant_scheme.h"

#include "util/error.h"

namespace beamline {
namespace {

struct SchemeInfo {
  QuantScheme scheme;
  std::string_view name, method, algo;
};
constexpr SchemeInfo kSchemes[] = {
    {QuantScheme::Fp8Block, "fp8", "fp8", ""},
    {QuantScheme::Mxfp8, "mxfp8", "mxfp8", ""},
    {QuantScheme::Nvfp4, "nvfp4", "modelopt", "NVFP4"},
};

const SchemeInfo& info(QuantScheme scheme) {
  for (const SchemeInfo& entry : kSchemes)
    if (entry.scheme == scheme) return entry;
  fail("unknown quantization scheme {}", static_cast<int>(scheme));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::optional<QuantScheme> quant_scheme_from_name(std::string_view name) {
  for (const SchemeInfo& entry : kSchemes)
    if (entry.name == name) return entry.scheme;
  return std::nullopt;
}

std::string_view quant_scheme_name(QuantScheme scheme) { return info(scheme).name; }

std::optional<QuantScheme> quant_scheme_from_method(std::string_view quant_method, std::string_view quant_algo) {
  for (const SchemeInfo& entry : kSchemes)
    if (entry.method == quant_method && (entry.algo.empty() || entry.algo == quant_algo)) return entry.scheme;
  return std::nullopt;
}

std::string_view quant_method_of(QuantScheme scheme) { return info(scheme).method; }
std::string_view quant_algo_of(QuantScheme scheme) { return info(scheme).algo; }

int64_t quant_row_granularity(QuantScheme scheme) { return scheme == QuantScheme::Fp8Block ? kFp8BlockSize : 1; }

int64_t quant_group_size(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::Fp8Block: return kFp8BlockSize;
    case QuantScheme::Mxfp8: return kMxfp8GroupSize;
    case QuantScheme::Nvfp4: return kNvfp4GroupSize;
  }
  fail("unknown quantization scheme {}", static_cast<int>(scheme));
}

QuantLayout quant_layout(QuantScheme scheme, int64_t out_features, int64_t in_features) {
  require(out_features > 0 && in_features > 0, "{} quantization: weight shape [{}, {}] must have positive dimensions",
          quant_scheme_name(scheme), out_features, in_features);
  const int64_t group = quant_group_size(scheme);
  switch (scheme) {
    case QuantScheme::Fp8Block:
      return {DType::F8_E4M3, {out_features, in_features}, "weight_scale_inv", DType::F32,
              {ceil_div(out_features, kFp8BlockSize), ceil_div(in_features, kFp8BlockSize)}, false};
    case QuantScheme::Mxfp8:
    case QuantScheme::Nvfp4:
      require(in_features % group == 0, "{} quantization needs in_features ({}) divisible by {}",
              quant_scheme_name(scheme), in_features, group);
      if (scheme == QuantScheme::Mxfp8)
        return {DType::F8_E4M3, {out_features, in_features}, "weight_scale", DType::F8_E8M0,
                {out_features, in_features / group}, false};
      return {DType::U8, {out_features, in_features / 2}, "weight_scale", DType::F8_E4M3,
              {out_features, in_features / group}, true};
  }
  fail("unknown quantization scheme {}", static_cast<int>(scheme));
}

}  // namespace beamline

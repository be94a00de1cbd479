#pragma once
// Brute-force references for the quant tests: the nearest code of a small float format, found by trying every
// code, so the encoders' bit tricks are checked against the definition rather than against themselves.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tensor/dtype.h"

namespace beamline::testing {

// The code among `num_codes` (decoded by `decode`) nearest to `value`, ties to the even code, magnitudes beyond
// `max_magnitude` clamped to it first (saturation), the sign of the chosen code matching the value's where the
// magnitude is zero. NaN codes are never chosen.
template <typename Decode>
uint8_t nearest_code(float value, int num_codes, float max_magnitude, Decode decode) {
  const double target = std::fmax(-max_magnitude, std::fmin(max_magnitude, static_cast<double>(value)));
  int best = -1;
  double best_distance = INFINITY;
  for (int code = 0; code < num_codes; ++code) {
    const float decoded = decode(static_cast<uint8_t>(code));
    if (std::isnan(decoded) || std::signbit(decoded) != std::signbit(value)) continue;
    const double distance = std::fabs(static_cast<double>(decoded) - target);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0 && best % 2 == 1)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best);
}

inline uint8_t nearest_e4m3(float value) { return nearest_code(value, 256, 448.0f, fp8_e4m3_to_f32); }
inline uint8_t nearest_e2m1(float value) { return nearest_code(value, 16, 6.0f, e2m1_to_f32); }

// Values of many magnitudes: normal samples times 2^k for k spread over [low_exponent, high_exponent].
inline std::vector<float> wide_values(std::mt19937_64& engine, std::size_t count, int low_exponent, int high_exponent) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(low_exponent, high_exponent);
  std::vector<float> values(count);
  for (float& v : values) v = std::ldexp(normal(engine), exponent(engine));
  return values;
}

}  // namespace beamline::testing

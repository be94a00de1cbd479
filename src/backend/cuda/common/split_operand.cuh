#pragma once
// F32 values as the sum of kSplitTerms 16-bit tensor-core operands (OperandPrecision::Split): hi = round(x),
// lo = round(x - hi), lo2 = round(x - hi - lo), every remainder exact in F32. In BF16 the three terms carry 8 + 8 + 8
// significant bits, so hi + lo + lo2 == x exactly for every finite x with |x| >= 2^-110 (below, lo2 falls under
// BF16's smallest subnormal, 2^-133: an absolute error under 2^-134), and a BF16 weight times each term is exact in an
// FP32 accumulator: three MMAs per product give what FP32 arithmetic gives. Two terms keep only about 17 bits (error
// up to 2^-17 |x|, several times the FP32 accumulation's own over a dot product: bench/results/2026-12-03-f32exact.md).
// Non-finite x: hi carries it (inf, NaN) and lo = lo2 = 0; a finite x that rounds to an infinite hi (|x| above the
// operand type's largest) gives infinite remainders, so its products are NaN, as they were with two terms.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/common/device_common.cuh"
#include "backend/cuda/common/operand_precision.h"

namespace beamline::cuda {

// The first kTerms terms of x, hi first (kSplitTerms: their sum is x; 1: the single rounding of
// OperandPrecision::Bf16).
template <typename O, int kTerms>
__device__ __forceinline__ void split_terms(float x, O (&terms)[kTerms]) {
  const bool finite = isfinite(x);
  float remainder = x;
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    terms[t] = from_float<O>(remainder);
    remainder = finite ? remainder - to_float(terms[t]) : 0.0f;
  }
}

// The terms of (x, y) as BF16 pairs (x in the low half, the lower column of an MMA operand), hi first: split_terms
// of each, two elements per conversion.
__device__ __forceinline__ void split_pair(float x, float y, uint32_t (&words)[kSplitTerms]) {
  const bool x_finite = isfinite(x), y_finite = isfinite(y);
#pragma unroll
  for (int t = 0; t < kSplitTerms; ++t) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(x, y);
    words[t] = *reinterpret_cast<const uint32_t*>(&pair);
    x = x_finite ? x - __low2float(pair) : 0.0f;
    y = y_finite ? y - __high2float(pair) : 0.0f;
  }
}

}  // namespace beamline::cuda

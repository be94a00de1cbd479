// The float32 compute mode's activation split on the CPU (bench/results/2026-12-03-f32exact.md): how much of an F32
// activation two BF16 terms (hi + lo) and three (hi + lo + lo2, common/split_operand.cuh) carry, what they give for
// zeros, subnormals, values that round to an infinite hi, infinities and NaN, and what each gives for a dot product
// once the sums are added up the tensor cores' way, in a model of mma.sync's FP32 accumulation (exact products,
// the k-block's values aligned to the largest exponent with 3 extra bits and truncated, the sum truncated to FP32:
// Fasi et al. 2021 for V100/T4/A100; the H200 is not measured here).
// Built as build/bench/bench_split_terms (bench/CMakeLists.txt), or alone:
//   g++ -O2 -std=c++20 -ffp-contract=off bench/bench_split_terms.cpp -o /tmp/split_terms && /tmp/split_terms
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// __float2bfloat16_rn: round to nearest even, NaN kept quiet.
float bf16(float x) {
  uint32_t u = to_bits(x);
  if (std::isnan(x)) return from_bits((u | 0x00400000u) & 0xffff0000u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return from_bits(u & 0xffff0000u);
}

// split_terms of common/split_operand.cuh with `count` terms (2: the split before 2026-12-03).
struct Terms {
  float t[3] = {0.0f, 0.0f, 0.0f};
};
Terms split(float x, int count) {
  Terms terms;
  const bool finite = std::isfinite(x);
  float remainder = x;
  for (int t = 0; t < count; ++t) {
    terms.t[t] = bf16(remainder);
    remainder = finite ? remainder - terms.t[t] : 0.0f;
  }
  return terms;
}

void representation() {
  std::mt19937 rng(7);
  double worst[2] = {0.0, 0.0};
  long inexact3 = 0, sampled = 0;
  for (int e = -110; e <= 127; ++e)
    for (int i = 0; i < 20000; ++i) {
      const float x = from_bits(((rng() & 1u) << 31) | (static_cast<uint32_t>(e + 127) << 23) | (rng() & 0x7fffffu));
      const Terms two = split(x, 2), three = split(x, 3);
      const double sum2 = double{two.t[0]} + two.t[1], sum3 = double{three.t[0]} + three.t[1] + three.t[2];
      if (!std::isfinite(sum2) || !std::isfinite(sum3)) continue;  // hi rounded to infinity: the edge cases below
      worst[0] = std::max(worst[0], std::fabs(sum2 - x) / std::fabs(x));
      worst[1] = std::max(worst[1], std::fabs(sum3 - x) / std::fabs(x));
      inexact3 += sum3 != x;
      ++sampled;
    }
  long exhaustive_bad = 0;
  for (uint32_t m = 0; m < (1u << 23); ++m) {
    const float x = from_bits((127u << 23) | m);
    const Terms three = split(x, 3);
    exhaustive_bad += double{three.t[0]} + three.t[1] + three.t[2] != x;
  }
  std::printf("## Representation\n\n%ld normal floats, |x| in [2^-110, 2^128), 20000 random mantissas per binade:\n",
              sampled);
  std::printf("- two terms: worst |hi + lo - x| / |x| = %.3e (2^%.2f)\n", worst[0], std::log2(worst[0]));
  std::printf("- three terms: worst %.3e, %ld of them inexact\n", worst[1], inexact3);
  std::printf("- three terms, every float in [1, 2) (2^23): %ld inexact\n\n", exhaustive_bad);
}

void edge_cases() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float cases[] = {0.0f,    -0.0f,          1e-45f,        1e-40f,          1.17549435e-38f, 1e-36f,
                         1e-30f,  3.3895314e38f, 3.39e38f,      3.4028235e38f,  -3.4028235e38f,  inf,
                         -inf,    nan};
  std::printf("## Edge cases: x * w for w = 0.5 as the accumulator adds the terms' exact products\n\n");
  std::printf("| x | two terms | three terms | exact |\n| --- | --- | --- | --- |\n");
  for (const float x : cases) {
    const Terms two = split(x, 2), three = split(x, 3);
    const float w = 0.5f;
    const float p2 = two.t[1] * w + two.t[0] * w, p3 = (three.t[2] * w + three.t[1] * w) + three.t[0] * w;
    std::printf("| %.9g | %.9g | %.9g | %.9g |\n", x, p2, p3, x * w);
  }
  std::printf("\n");
}

int extra_bits = 3;
double truncate_to(double v, int top_exponent, int bits) {
  const double quantum = std::ldexp(1.0, top_exponent - bits + 1);
  return std::trunc(v / quantum) * quantum;
}
float truncate_float(double v) {
  if (v == 0.0) return 0.0f;
  int e;
  std::frexp(v, &e);
  return static_cast<float>(truncate_to(v, e - 1, 24));
}
// One MMA k-block into accumulator c, the model's way.
float mma_block(float c, const double* products, int n) {
  double largest = std::fabs(double{c});
  for (int i = 0; i < n; ++i) largest = std::max(largest, std::fabs(products[i]));
  if (largest == 0.0) return c;
  int e;
  std::frexp(largest, &e);
  double sum = truncate_to(c, e - 1, 24 + extra_bits);
  for (int i = 0; i < n; ++i) sum += truncate_to(products[i], e - 1, 24 + extra_bits);
  return truncate_float(sum);
}

void dot_products() {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::printf("## Dot products: ||error|| / ||float64|| over 400 outputs, x ~ U(-1, 1), w = bf16(U(-1, 1) / sqrt(K))\n\n");
  std::printf("| K | CPU FP32 loop | MMA model, exact x | two terms, one chain | three terms, one chain | three terms, "
              "chains of 4 k-blocks added in FP32 |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const int k : {256, 1024, 4096, 20480}) {
    double reference_norm = 0, cpu = 0, exact = 0, two = 0, three = 0, promoted = 0;
    for (int o = 0; o < 400; ++o) {
      std::vector<float> x(k), w(k);
      for (int i = 0; i < k; ++i) {
        x[i] = uniform(rng);
        w[i] = bf16(uniform(rng) / std::sqrt(static_cast<float>(k)));
      }
      double reference = 0;
      float cpu_sum = 0, exact_chain = 0, two_chain = 0, three_chain = 0, stage = 0, promoted_sum = 0;
      for (int i = 0; i < k; ++i) {
        reference += double{x[i]} * w[i];
        cpu_sum += x[i] * w[i];
      }
      for (int k0 = 0; k0 < k; k0 += 16) {
        double products[4][16];  // exact x, then the terms hi, lo, lo2 of three (lo of two equals three's lo)
        for (int i = 0; i < 16; ++i) {
          const Terms terms = split(x[k0 + i], 3);
          products[0][i] = double{x[k0 + i]} * w[k0 + i];
          for (int t = 0; t < 3; ++t) products[t + 1][i] = double{terms.t[t]} * w[k0 + i];
        }
        exact_chain = mma_block(exact_chain, products[0], 16);
        two_chain = mma_block(mma_block(two_chain, products[2], 16), products[1], 16);
        for (float* chain : {&three_chain, &stage})
          *chain = mma_block(mma_block(mma_block(*chain, products[3], 16), products[2], 16), products[1], 16);
        if (k0 / 16 % 4 == 3 || k0 + 16 >= k) {
          promoted_sum += stage;
          stage = 0;
        }
      }
      const auto square = [&](double v) { return (v - reference) * (v - reference); };
      reference_norm += reference * reference;
      cpu += square(cpu_sum);
      exact += square(exact_chain);
      two += square(two_chain);
      three += square(three_chain);
      promoted += square(promoted_sum);
    }
    const auto relative = [&](double sum) { return std::sqrt(sum / reference_norm); };
    std::printf("| %d | %.2e | %.2e | %.2e | %.2e | %.2e |\n", k, relative(cpu), relative(exact), relative(two),
                relative(three), relative(promoted));
  }
}

}  // namespace

int main() {
  representation();
  edge_cases();
  dot_products();
}

#pragma once
// Counter-based randomness for random weights: value i of a tensor depends only on (key, i), so a tensor can be
// filled in any order, on any thread, on the host or on a device, and the bytes are the same everywhere. A
// checkpoint written by make-model and the same preset materialised on a device (--load-format dummy) hold
// identical weights for the same seed.
#include <cmath>
#include <cstdint>
#include <string_view>

#ifdef __CUDACC__
#define BEAMLINE_HOST_DEVICE __host__ __device__
#else
#define BEAMLINE_HOST_DEVICE
#endif

namespace beamline {

// The splitmix64 finalizer: a bijection of 64-bit words with full avalanche (hashes, seeds, random streams).
BEAMLINE_HOST_DEVICE inline uint64_t finalize64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

BEAMLINE_HOST_DEVICE inline uint64_t mix64(uint64_t z) { return finalize64(z + 0x9e3779b97f4a7c15ull); }

// Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled to unit
// variance. One hash per value keeps multi-terabyte checkpoints fast to generate.
BEAMLINE_HOST_DEVICE inline float standard_normal(uint64_t key, uint64_t index) {
  const uint64_t bits = mix64(key + index * 0x9e3779b97f4a7c15ull);
  const double sum = static_cast<double>((bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) + (bits >> 48));
  constexpr double kMean = 4 * 65535.0 / 2;
  constexpr double kStddev = 37837.22723720648;  // sqrt(4 * (65536² - 1) / 12), the exact double
  return static_cast<float>((sum - kMean) / kStddev);
}

// Value `index` of a tensor drawn as mean + stddev * N(0, 1), rounded the same way on host and device (the device
// would otherwise fuse the multiply-add and differ in the last bit).
BEAMLINE_HOST_DEVICE inline float normal_value(uint64_t key, uint64_t index, float mean, float stddev) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(mean, __fmul_rn(stddev, standard_normal(key, index)));
#else
  return mean + stddev * standard_normal(key, index);
#endif
}

// The key of one tensor's stream: the seed mixed with an FNV-1a hash of the tensor's name.
inline uint64_t stream_key(uint64_t seed, std::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return mix64(seed ^ mix64(hash));
}

}  // namespace beamline

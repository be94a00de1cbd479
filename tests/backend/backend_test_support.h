#pragma once
// Random inputs and host/backend plumbing shared by the op tests. Every op test runs on each backend that
// this build has (cpu always; cuda in a -DBEAMLINE_CUDA=ON build, which links it into the tests of this folder,
// when a device is present), against naive loops on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "tensor/dtype.h"

namespace beamline::testing {

class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  std::vector<float> normal(std::size_t count, float stddev = 1.0f) {
    std::normal_distribution<float> distribution(0.0f, stddev);
    std::vector<float> values(count);
    for (float& v : values) v = distribution(engine_);
    return values;
  }
  int32_t integer(int32_t low, int32_t high) {  // inclusive
    return std::uniform_int_distribution<int32_t>(low, high)(engine_);
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

// A weight stored as `dtype`, with the F32 values the backend will see (rounded through the dtype).
struct HostWeight {
  std::vector<float> values;
  Tensor tensor;
};

inline HostWeight make_weight(Backend& backend, DType dtype, std::vector<int64_t> shape, std::vector<float> values) {
  HostWeight weight;
  if (dtype == DType::F32) {
    weight.values = values;
    weight.tensor = backend.upload(values.data(), dtype, std::move(shape));
    return weight;
  }
  std::vector<uint16_t> bits(values.size());
  weight.values.resize(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    bits[i] = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
    weight.values[i] = dtype == DType::BF16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  }
  weight.tensor = backend.upload(bits.data(), dtype, std::move(shape));
  return weight;
}

inline std::vector<std::string> backend_names() { return {"cpu", "cuda"}; }

// BEAMLINE_REQUIRE_CUDA=1 marks the machine the device instances exist for (bench/gpu_ctest.sh sets it): there a
// device backend that cannot start is a failure, not a skip.
inline bool device_required() {
  const char* required = std::getenv("BEAMLINE_REQUIRE_CUDA");
  return required != nullptr && std::string(required) == "1";
}

class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A device backend that cannot start (no device here, or a build without it) skips its instance, saying why,
  // unless the device is required.
  void SetUp() override {
    try {
      backend_ = create_backend(GetParam());
    } catch (const std::exception& error) {
      if (device_required()) FAIL() << "backend " << GetParam() << " required but unavailable: " << error.what();
      GTEST_SKIP() << "backend " << GetParam() << " unavailable: " << error.what();
    }
  }
  Backend& backend() { return *backend_; }
  std::unique_ptr<Backend> backend_;
};

// |actual - expected| <= tolerance * max(1, |expected|), elementwise, with the first failure reported.
inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double bound = tolerance * std::max(1.0, std::abs(expected[i]));
    if (!(std::abs(actual[i] - expected[i]) <= bound)) {
      FAIL() << what << ": element " << i << " is " << actual[i] << ", expected " << expected[i] << " (tolerance "
             << bound << ")";
    }
  }
}

}  // namespace beamline::testing

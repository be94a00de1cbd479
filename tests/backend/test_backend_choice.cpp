// Which backend and which storage types the vLLM-named flags choose: --device auto, --dtype, --kv-cache-dtype.
#include <gtest/gtest.h>

#include <memory>


#include "backend/backend.h"
#include "backend/registry.h"
#include "util/error.h"

namespace beamline {
namespace {

TEST(BackendChoice, KvCacheAutoFollowsTheComputeDtype) {
  EXPECT_EQ(parse_kv_cache_dtype("auto", ComputeDType::Float32), DType::F32);
  EXPECT_EQ(parse_kv_cache_dtype("auto", ComputeDType::BFloat16), DType::BF16);
  EXPECT_EQ(parse_kv_cache_dtype("auto", parse_compute_dtype("float32", Device::Cuda)), DType::F32);
  EXPECT_EQ(parse_kv_cache_dtype("auto", parse_compute_dtype("auto", Device::Cuda)), DType::BF16);
  EXPECT_EQ(parse_kv_cache_dtype("auto", parse_compute_dtype("auto", Device::Cpu)), DType::F32);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16", ComputeDType::Float32), DType::BF16);
  EXPECT_THROW(parse_kv_cache_dtype("int4", ComputeDType::Float32), Error);
  EXPECT_EQ(parse_kv_cache_dtype("fp8", ComputeDType::BFloat16), DType::F8_E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3", ComputeDType::Float32), DType::F8_E4M3);
  EXPECT_THROW(parse_kv_cache_dtype("fp8_e5m2", ComputeDType::Float32), Error);
}

TEST(BackendChoice, AutoTakesTheGpuWherePresentElseTheCpu) {
  const std::unique_ptr<Backend> chosen = create_backend("auto");
  bool cuda_available = true;
  try {
    create_backend("cuda");
  } catch (const Error&) {
    cuda_available = false;
  }
  EXPECT_EQ(chosen->device(), cuda_available ? Device::Cuda : Device::Cpu);
  EXPECT_THROW(create_backend("tpu"), Error);
}

}  // namespace
}  // namespace beamline

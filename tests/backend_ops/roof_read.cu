#include "roof_read.h"

namespace beamline::backend_ops {
namespace {

// A value no fold of real data is expected to give; the store under it keeps every load alive.
constexpr unsigned kNeverFolded = 0x9e3779b9u;

template <RoofLoad kLoad>
__device__ __forceinline__ uint4 load16(const uint4* address) {
  if constexpr (kLoad == RoofLoad::ReadOnly) {
    return *address;
  } else {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address));
    return v;
  }
}

template <int kUnroll, RoofLoad kLoad>
__global__ void roof_read_kernel(const uint4* __restrict__ data, int64_t count, unsigned* __restrict__ sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned folded = 0;
  for (; i + (kUnroll - 1) * stride < count; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load16<kLoad>(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) folded ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < count; i += stride) {
    const uint4 v = load16<kLoad>(data + i);
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (folded == kNeverFolded) sink[0] = folded;
}

template <int kUnroll, RoofLoad kLoad>
const void* kernel_of() {
  return reinterpret_cast<const void*>(&roof_read_kernel<kUnroll, kLoad>);
}

const void* kernel_for(const RoofReadConfig& config) {
  const bool plain = config.load == RoofLoad::ReadOnly;
  switch (config.unroll) {
    case 4: return plain ? kernel_of<4, RoofLoad::ReadOnly>() : kernel_of<4, RoofLoad::NoAllocate>();
    case 8: return plain ? kernel_of<8, RoofLoad::ReadOnly>() : kernel_of<8, RoofLoad::NoAllocate>();
    case 16: return plain ? kernel_of<16, RoofLoad::ReadOnly>() : kernel_of<16, RoofLoad::NoAllocate>();
    default: return nullptr;
  }
}

}  // namespace

int roof_read_blocks_per_sm(const RoofReadConfig& config) {
  const void* kernel = kernel_for(config);
  int blocks = 0;
  if (kernel == nullptr ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, config.threads, 0) != cudaSuccess)
    return 0;
  return blocks;
}

cudaError_t launch_roof_read(const void* data, int64_t bytes, const RoofReadConfig& config, int blocks,
                             unsigned* sink, cudaStream_t stream) {
  const void* kernel = kernel_for(config);
  if (kernel == nullptr || bytes % 16 != 0) return cudaErrorInvalidValue;
  const auto* words = static_cast<const uint4*>(data);
  int64_t count = bytes / 16;
  void* arguments[] = {&words, &count, &sink};
  return cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(config.threads)),
                          arguments, 0, stream);
}

}  // namespace beamline::backend_ops

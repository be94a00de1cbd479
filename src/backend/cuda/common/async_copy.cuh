#pragma once
// cp.async (sm_80 and later): 16-byte copies from global to shared memory that bypass registers and L1, issued in
// commit groups that a thread waits for, shared by the tensor-core kernels' pipelines.
#include <cuda_runtime.h>

#include <cstdint>

namespace beamline::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes from `global` to the shared address `shared`; zeros when !valid (nothing is read then).
__device__ __forceinline__ void copy_async16(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async16(void* shared, const void* global, bool valid) {
  copy_async16(shared_address(shared), global, valid);
}

// 4 bytes (4-byte aligned at both ends); zeros when !valid. Through L1 (.ca): .cg takes only 16-byte copies.
__device__ __forceinline__ void copy_async4(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }

// Until at most kPending of this thread's newest commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace beamline::cuda

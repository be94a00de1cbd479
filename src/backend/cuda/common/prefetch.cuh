#pragma once
// L2 prefetch for the streaming kernels (decode attention, the one-token experts): bytes in flight that take no
// registers.
namespace beamline::cuda {

// Asks for the line holding `address` in L2 without waiting for it.
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

}  // namespace beamline::cuda

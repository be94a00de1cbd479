#pragma once
// Shared-memory mbarriers (sm_80 and later) for warp-specialized pipelines: producers signal a stage's "full"
// barrier, consumers its "empty" one, and each side waits on a barrier's phase by parity.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/async_copy.cuh"

namespace beamline::cuda {

__device__ __forceinline__ void init_mbarrier(uint64_t* barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
}

// One arrival, releasing this thread's earlier shared-memory writes to the threads that see the phase complete.
__device__ __forceinline__ void arrive_mbarrier(uint64_t* barrier) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   shared_address(barrier))
               : "memory");
}

// One arrival on `barrier` once every cp.async this thread has issued so far has landed (the arrival is counted in
// the barrier's expected arrivals: noinc).
__device__ __forceinline__ void arrive_mbarrier_when_copied(uint64_t* barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}

// Until the barrier's phase of this parity has completed (a fresh barrier counts its phase before 0, parity 1, as
// completed, so a producer's first pass over its stages does not wait). The retry loop is inside the asm, so the
// compiler sees no divergent branch: warpgroup MMAs after the wait need not be serialized.
__device__ __forceinline__ void wait_mbarrier(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred ready;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
      "@!ready bra wait_%=;\n}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
}

}  // namespace beamline::cuda

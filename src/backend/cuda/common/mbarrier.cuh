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

// Arrives on `barrier` and adds `bytes` to the bytes its phase waits for (copy_bulk's completions count them down).
__device__ __forceinline__ void arrive_expecting_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the bulk copy engine,
// counted down from `barrier`'s expected bytes when they have landed (sm_90).
__device__ __forceinline__ void copy_bulk(void* shared, const void* global, uint32_t bytes, uint64_t* barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(shared)),
               "l"(global), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
}

// Orders this thread's earlier ordinary shared-memory writes before later bulk copies (the async proxy) into them.
__device__ __forceinline__ void fence_shared_for_async_copies() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Makes the barriers this thread initialised visible to the bulk copy engine, before the first copy signals one.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
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

#pragma once
// The read-bandwidth roof's kernel (`backend_ops perf roof`, roof.cpp): a plain streaming read of a buffer, 16 bytes a
// thread per load, `unroll` loads issued per iteration of a grid-stride loop (how many stay in flight is ptxas's
// schedule: it keeps 32 registers, full occupancy), the values folded into one word that is stored only if it equals
// a constant (so that no load is optimised away). Not a backend kernel: it does no work of
// the model, it measures how fast this GPU lets any kernel read HBM.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace beamline::backend_ops {

enum class RoofLoad : uint8_t {
  ReadOnly,   // a plain load of a const __restrict__ pointer: ld.global.nc
  NoAllocate  // ld.global.nc.L1::no_allocate with a 256-byte L2 prefetch (what weight-streaming kernels issue)
};

struct RoofReadConfig {
  int threads;  // per block
  int unroll;   // 16-byte loads per thread per iteration: 4, 8 or 16
  RoofLoad load;
};

// Blocks per SM that fit at `config` (the occupancy API), 0 for an unknown unroll.
int roof_read_blocks_per_sm(const RoofReadConfig& config);
// Reads bytes [0, bytes) of `data` (16-byte aligned, `bytes` a multiple of 16) with `blocks` blocks.
cudaError_t launch_roof_read(const void* data, int64_t bytes, const RoofReadConfig& config, int blocks,
                             unsigned* sink, cudaStream_t stream);

}  // namespace beamline::backend_ops

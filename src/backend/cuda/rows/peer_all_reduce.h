#pragma once
// The CUDA backend's peer memory (backend/peer_all_reduce.h), registered with the backend (cuda_backend.cpp): one
// cudaMalloc per rank holding its AllReduceSignal and its partial rows (kAllReduceMaxRows x kAllReduceMaxHidden F32,
// 2 MiB), shared with the group's other processes through a cudaIpcMemHandle, and cuda::all_reduce_add_rms_norm with
// the handshake over it (all_reduce_norm.h), on the backend's stream.
#include <memory>

#include "backend/peer_all_reduce.h"

namespace beamline {

class CudaBackend;

std::unique_ptr<PeerAllReduce> make_cuda_peer_all_reduce(CudaBackend& backend);

}  // namespace beamline

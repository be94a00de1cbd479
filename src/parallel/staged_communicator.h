#pragma once
// A group's collectives on a backend's tensors through host memory: each op copies its tensors to the host, runs the
// host communicator's op (MPI) and copies the result back. For ranks that share one GPU, which NCCL refuses
// ("Duplicate GPU detected"; make_nccl_communicator picks this instead): tensor parallelism checked and measured on
// one device (bench/gpu_tp_fused.sh), not a fast path.
#include <memory>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace beamline {

// `host` works on host tensors (an MpiCommunicator); `backend` must outlive the communicator.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host, Backend& backend);

}  // namespace beamline

#pragma once
// Communicator over NCCL for CUDA tensors (built with BEAMLINE_CUDA). NCCL is bootstrapped over the group's MPI
// communicator (`host`: rank 0 of the group makes the ncclUniqueId and broadcasts it) and loaded at run time
// (libnccl.so.2, declared by the toolkit's nccl.h), so a single-GPU binary runs where NCCL is not installed.
#include <memory>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace beamline {

// Every op waits for `backend`'s queued work, runs on a stream of its own and is polled until
// `timeout_seconds`; then the NCCL communicator is aborted and an Error names the rank and group.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host, Backend& backend,
                                                     double timeout_seconds);

}  // namespace beamline

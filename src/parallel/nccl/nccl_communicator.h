#pragma once
// Communicator over NCCL for CUDA tensors (built with BEAMLINE_CUDA). NCCL is bootstrapped over the group's MPI
// communicator (`host`: rank 0 of the group makes the ncclUniqueId and broadcasts it) and loaded at run time
// (libnccl.so.2, declared by the toolkit's nccl.h), so a single-GPU binary runs where NCCL is not installed.
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "parallel/communicator.h"

namespace beamline {

// Every op waits for `backend`'s queued work, runs on a stream of its own and is polled until
// `timeout_seconds`; then the NCCL communicator is aborted and an Error names the rank and group. A group whose ranks
// share a GPU (NCCL refuses it) gets the staged communicator instead (parallel/staged_communicator.h), with a warning.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host, Backend& backend,
                                                     double timeout_seconds);
// The same with an ncclUniqueId made elsewhere (weight sync: the trainer, rank 0, hands it over TCP) and no host
// group: barrier, broadcast_bytes and all_reduce_max are refused.
std::unique_ptr<Communicator> make_nccl_communicator(std::span<const std::byte> unique_id, int32_t rank, int32_t size,
                                                     std::string name, Backend& backend, double timeout_seconds);

}  // namespace beamline

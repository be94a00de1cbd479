#pragma once
// Communicator over MPI for host-memory tensors (the CPU backend), and the deadline-bounded wait that every MPI call of
// beamline goes through: nonblocking operations tested in a loop until --distributed-timeout-seconds, so that a dead
// or stuck peer is an Error, not a hang. Internal to src/parallel (it exposes mpi.h).
#include <mpi.h>

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace beamline {

// Message tags on MPI_COMM_WORLD: a rank's failure report to rank 0, and the tensors of send/recv.
constexpr int kFailureTag = 7001;
constexpr int kTensorTag = 7002;

// Waits for `request` until `timeout_seconds` (infinity: no deadline). While waiting on rank 0, a failure report of another rank
// (MpiWorld::fail) is raised as an Error naming that rank. `what` names the operation and group for the timeout's
// message.
void wait_for(MPI_Request& request, double timeout_seconds, const std::string& what);

// Takes ownership of `comm` (freed at destruction).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name, double timeout_seconds);

}  // namespace beamline

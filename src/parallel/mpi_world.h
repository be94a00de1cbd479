#pragma once
// The processes of one distributed run, as MPI (Debian's Open MPI) started them: `mpirun -np N beamline ...`, on one
// node or several. MpiWorld initialises MPI, makes the groups' communicators (MPI_Comm_split), and carries a failing
// rank's last words to rank 0, so that the server can stop naming the rank and the cause. MPI is used from one thread
// at a time (MPI_THREAD_SERIALIZED): the main thread at start and end, the engine thread in between.
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace beamline {

// Whether this process was started by mpirun (Open MPI's or PMIx's rank variables are set).
bool launched_by_mpi();

class MpiWorld {
 public:
  // MPI_Init_thread. `timeout_seconds` bounds every wait of the communicators this world makes.
  explicit MpiWorld(double timeout_seconds);
  ~MpiWorld();  // MPI_Finalize
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int32_t rank() const { return rank_; }
  int32_t size() const { return size_; }
  int32_t local_rank() const { return local_rank_; }  // among the ranks of this node
  double timeout_seconds() const { return timeout_seconds_; }

  // Before the first CUDA call: this process sees only the GPU of its local rank (the local_rank()-th of
  // CUDA_VISIBLE_DEVICES when that is set), as device 0.
  void use_local_gpu() const;

  // A communicator over host memory (MpiCommunicator) for the ranks that pass the same `color`, ordered by `key`.
  // Collective over the world. `name` says what the group is ("tensor-parallel"); the world ranks are appended.
  std::unique_ptr<Communicator> split(const std::string& name, int32_t color, int32_t key);

  // Logs `message`, sends it to rank 0 (which raises it from its next wait as an Error naming this rank), gives rank 0
  // time to end the job, then ends it itself (MPI_Abort).
  [[noreturn]] void fail(const std::string& message);

 private:
  int32_t rank_ = 0, size_ = 1, local_rank_ = 0;
  double timeout_seconds_;
};

}  // namespace beamline

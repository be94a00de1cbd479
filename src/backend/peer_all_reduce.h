#pragma once
// The tensor-parallel all-reduce fused into the sandwich norm across processes (issue 19, docs/parallel.md): each
// rank's partial rows in memory that the other processes of its group map (CUDA: an IPC handle, read over NVLink),
// and the op that sums them there (Backend::all_reduce_add_rms_norm's math across processes). A backend offers it with
// its registration (registry.h); the handles travel over the group's communicator (parallel/fused_all_reduce_norm.h),
// which the backend does not know.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace beamline {

class PeerAllReduce {
 public:
  virtual ~PeerAllReduce() = default;
  // The most rows and the widest row one add_rms_norm takes (partial() holds max_rows() x max_hidden() values).
  virtual int64_t max_rows() const = 0;
  virtual int64_t max_hidden() const = 0;
  // The bytes a peer needs to map this rank's memory.
  virtual std::vector<std::byte> handle() const = 0;
  // Maps the group's memory: handles[p] is rank p's handle() (this rank's own at `rank`), at most kMaxAllReduceRanks.
  // An Error naming the peer whose memory cannot be mapped.
  virtual void connect(std::span<const std::vector<std::byte>> handles, int32_t rank) = 0;
  // This rank's partial F32 [rows, hidden] in the mapped memory: where a row-parallel projection writes its output.
  virtual Tensor partial(int64_t rows, int64_t hidden) = 0;
  // Backend::all_reduce_add_rms_norm over every rank's partial(rows, hidden), rows and hidden residual's: summed in
  // rank order, so that every rank computes the same bits. Collective: every rank of the group calls it with the
  // same shapes, in the same order, after writing its partial (on the backend's queue, no host wait).
  virtual void add_rms_norm(Tensor& residual, const Tensor& weight, float eps, float scale, const Tensor& next_weight,
                            Tensor& out) = 0;
};

// New peer memory on `backend` (which must outlive it), from the factory its kind registered with register_backend
// (registry.h); null where it has none (the CPU: its tensor-parallel groups all-reduce over MPI, then norm).
std::unique_ptr<PeerAllReduce> make_peer_all_reduce(Backend& backend);

}  // namespace beamline

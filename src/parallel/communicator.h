#pragma once
// The collectives a sharded model needs, over one group of ranks (a tensor-parallel group, a pipeline, ...).
// Implementations: MpiCommunicator (parallel/mpi_communicator.h) for host tensors (the CPU backend, CI) and
// NcclCommunicator (parallel/nccl_communicator.h) for CUDA tensors. Every call is collective over the group (or,
// for send/recv, between two of its ranks) and waits at most --distributed-timeout-seconds for its peers: a peer
// that is dead or stuck gives a beamline::Error naming this rank and the group, never a hang.
//
// Tensors are contiguous tensors of the backend the communicator was made for; reductions take F32 only, the
// moves (gather, all-to-all, broadcast, send/recv) any dtype. Counts are in elements.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/tensor.h"

namespace beamline {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;  // in this group
  virtual int32_t size() const = 0;
  // "tensor-parallel group (world ranks 0, 1)": for messages.
  virtual const std::string& name() const = 0;

  // tensor = the element-wise sum of every rank's tensor.
  virtual void all_reduce_sum(Tensor& tensor) = 0;
  // out = every rank's `in`, rank after rank (out.numel() = size() * in.numel()).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // The same along the last axis: in [R, C] from every rank, out [R, size() * C] with rank p's block in columns
  // [p * C, (p + 1) * C) (vocabulary-parallel logits).
  virtual void all_gather_columns(const Tensor& in, Tensor& out) = 0;
  // in = size() chunks of out.numel() elements; out = the sum over ranks of their chunk rank().
  virtual void reduce_scatter_sum(const Tensor& in, Tensor& out) = 0;
  // Rank p's elements [sum(send_counts[:q]), +send_counts[q]) of `in` go to rank q, which receives them at
  // [sum(recv_counts[:p]), +recv_counts[p]) of `out`. recv_counts[p] must equal rank p's send_counts[rank()].
  virtual void all_to_all(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                          std::span<const int64_t> recv_counts) = 0;
  // tensor = root's tensor.
  virtual void broadcast(Tensor& tensor, int32_t root) = 0;
  // Point to point inside the group; shapes must agree between the pair.
  virtual void send(const Tensor& tensor, int32_t peer) = 0;
  virtual void recv(Tensor& tensor, int32_t peer) = 0;
  virtual void barrier() = 0;

  // Host values, whatever device the tensors live on (step plans, batch sizes, bootstrap ids).
  // bytes = root's bytes (resized on the other ranks). `wait_forever`: no deadline (ranks that wait for the next step
  // plan of an idle server).
  virtual void broadcast_bytes(std::vector<std::byte>& bytes, int32_t root, bool wait_forever = false) = 0;
  // The largest or smallest of every rank's value.
  virtual int64_t all_reduce_max(int64_t value) = 0;
  int64_t all_reduce_min(int64_t value) { return -all_reduce_max(-value); }
};

}  // namespace beamline

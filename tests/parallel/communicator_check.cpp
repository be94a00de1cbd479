// Run under mpirun (tests/parallel/CMakeLists.txt): the MPI communicator's collectives on host tensors against values
// each rank can compute alone, and its failure paths:
//   communicator_check collectives   every collective, twice, over all ranks, over a split group and through the
//                                    staged communicator (parallel/staged_communicator.h) on the CPU backend
//   communicator_check timeout       rank 1 skips an all-reduce: the others get an Error naming the deadline in time
//   communicator_check failure       the last rank reports a failure: rank 0's wait raises it, naming that rank
// The failure cases end the job with MPI_Abort after printing "... case passed".
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "backend/registry.h"
#include "parallel/mpi_world.h"
#include "parallel/staged_communicator.h"
#include "util/error.h"

namespace beamline {
namespace {

Tensor host_tensor(std::vector<float>& values, std::vector<int64_t> shape) {
  return Tensor(Device::Cpu, DType::F32, std::move(shape), reinterpret_cast<std::byte*>(values.data()), nullptr);
}

float value_of(int32_t rank, int64_t index) { return static_cast<float>(rank * 1000 + index) * 0.5f; }

void expect(bool condition, const std::string& what) { require(condition, "check failed: {}", what); }

void check_collectives(Communicator& comm) {
  const int32_t rank = comm.rank(), size = comm.size();
  const std::string where = " in the " + comm.name();
  // all_reduce_sum
  std::vector<float> values(10);
  for (int64_t i = 0; i < 10; ++i) values[i] = value_of(rank, i);
  Tensor tensor = host_tensor(values, {2, 5});
  comm.all_reduce_sum(tensor);
  for (int64_t i = 0; i < 10; ++i) {
    float sum = 0;
    for (int32_t p = 0; p < size; ++p) sum += value_of(p, i);
    expect(values[i] == sum, "all_reduce_sum" + where);
  }
  // all_gather and all_gather_columns: in [2, 3] per rank
  std::vector<float> in(6), gathered(6 * size), columns(6 * size);
  for (int64_t i = 0; i < 6; ++i) in[i] = value_of(rank, i);
  Tensor in_tensor = host_tensor(in, {2, 3}), gathered_tensor = host_tensor(gathered, {size * 2, 3}),
         columns_tensor = host_tensor(columns, {2, 3 * size});
  comm.all_gather(in_tensor, gathered_tensor);
  comm.all_gather_columns(in_tensor, columns_tensor);
  for (int32_t p = 0; p < size; ++p)
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t c = 0; c < 3; ++c) {
        expect(gathered[(p * 2 + r) * 3 + c] == value_of(p, r * 3 + c), "all_gather" + where);
        expect(columns[r * 3 * size + p * 3 + c] == value_of(p, r * 3 + c), "all_gather_columns" + where);
      }
  // reduce_scatter_sum: 4 elements per rank's chunk
  std::vector<float> chunks(4 * size), mine(4);
  for (int64_t i = 0; i < 4 * size; ++i) chunks[i] = value_of(rank, i);
  Tensor chunks_tensor = host_tensor(chunks, {4 * size}), mine_tensor = host_tensor(mine, {4});
  comm.reduce_scatter_sum(chunks_tensor, mine_tensor);
  for (int64_t i = 0; i < 4; ++i) {
    float sum = 0;
    for (int32_t p = 0; p < size; ++p) sum += value_of(p, rank * 4 + i);
    expect(mine[i] == sum, "reduce_scatter_sum" + where);
  }
  // all_to_all: rank p sends q + p + 1 elements to rank q (of value p * 100 + q)
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> send, received;
  for (int32_t q = 0; q < size; ++q) {
    send_counts.push_back(q + rank + 1);
    recv_counts.push_back(rank + q + 1);
    send.insert(send.end(), static_cast<std::size_t>(q + rank + 1), static_cast<float>(rank * 100 + q));
  }
  received.resize(static_cast<std::size_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0})));
  Tensor send_tensor = host_tensor(send, {static_cast<int64_t>(send.size())}),
         received_tensor = host_tensor(received, {static_cast<int64_t>(received.size())});
  comm.all_to_all(send_tensor, send_counts, received_tensor, recv_counts);
  std::size_t at = 0;
  for (int32_t p = 0; p < size; ++p)
    for (int64_t i = 0; i < recv_counts[p]; ++i) expect(received[at++] == static_cast<float>(p * 100 + rank), "all_to_all" + where);
  // broadcast from the last rank
  std::vector<float> shared(3, static_cast<float>(rank));
  Tensor shared_tensor = host_tensor(shared, {3});
  comm.broadcast(shared_tensor, size - 1);
  for (float v : shared) expect(v == static_cast<float>(size - 1), "broadcast" + where);
  // send / recv around the ring
  if (size > 1) {
    std::vector<float> outgoing(5, static_cast<float>(rank)), incoming(5, -1.0f);
    Tensor out_tensor = host_tensor(outgoing, {5}), in_ring = host_tensor(incoming, {5});
    const int32_t next = (rank + 1) % size, previous = (rank + size - 1) % size;
    if (rank % 2 == 0) {
      comm.send(out_tensor, next);
      comm.recv(in_ring, previous);
    } else {
      comm.recv(in_ring, previous);
      comm.send(out_tensor, next);
    }
    for (float v : incoming) expect(v == static_cast<float>(previous), "send/recv" + where);
  }
  comm.barrier();
  // host values
  std::vector<std::byte> bytes;
  if (rank == 0) bytes.assign(7, std::byte{42});
  comm.broadcast_bytes(bytes, 0);
  expect(bytes.size() == 7 && bytes[6] == std::byte{42}, "broadcast_bytes" + where);
  expect(comm.all_reduce_max(rank * 3) == (size - 1) * 3, "all_reduce_max" + where);
  expect(comm.all_reduce_min(rank + 5) == 5, "all_reduce_min" + where);
}

void collectives(MpiWorld& world) {
  std::unique_ptr<Communicator> all = world.split("world", 0, world.rank());
  // Two groups of unequal sizes (ranks 0 and 1; the rest), in reverse rank order.
  std::unique_ptr<Communicator> part = world.split("part", world.rank() < 2 ? 0 : 1, -world.rank());
  const std::string expected_part = world.rank() < 2 ? "part group (world ranks 1, 0)" : "part group (world ranks ";
  expect(all->name().find("world ranks 0, 1, 2") != std::string::npos && part->name().find(expected_part) == 0,
         "group names list their world ranks: " + all->name() + " / " + part->name());
  // The staged communicator (ranks sharing a GPU) over the CPU backend: the same collectives through its copies.
  std::unique_ptr<Backend> cpu = create_backend("cpu");
  std::unique_ptr<Communicator> staged = make_staged_communicator(world.split("staged", 0, world.rank()), *cpu);
  for (int round = 0; round < 2; ++round) {
    check_collectives(*all);
    check_collectives(*part);
    check_collectives(*staged);
  }
  spdlog::info("rank {}: collectives passed over {}, {} and {} (staged)", world.rank(), all->name(), part->name(),
               staged->name());
}

void timeout(MpiWorld& world) {
  std::unique_ptr<Communicator> all = world.split("world", 0, world.rank());
  if (world.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(world.timeout_seconds() + 3));
    return;
  }
  std::vector<float> values(4, 1.0f);
  Tensor tensor = host_tensor(values, {4});
  const auto start = std::chrono::steady_clock::now();
  try {
    all->all_reduce_sum(tensor);
  } catch (const Error& error) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    spdlog::info("rank {} after {:.1f} s: {}", world.rank(), waited, error.what());
    expect(std::strstr(error.what(), "no answer within --distributed-timeout-seconds") != nullptr &&
               std::strstr(error.what(), ("rank " + std::to_string(world.rank()) + ":").c_str()) != nullptr,
           "the timeout names this rank and the flag");
    expect(waited >= world.timeout_seconds() && waited < world.timeout_seconds() + 2, "the timeout is on time");
    if (world.rank() == 0) spdlog::info("timeout case passed");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return;
  }
  fail("rank {}: the all-reduce without rank 1 returned", world.rank());
}

void failure(MpiWorld& world) {
  std::unique_ptr<Communicator> all = world.split("world", 0, world.rank());
  if (world.rank() == world.size() - 1) world.fail("cannot load its shard (a test failure)");
  std::vector<float> values(4, 1.0f);
  Tensor tensor = host_tensor(values, {4});
  try {
    all->all_reduce_sum(tensor);
  } catch (const Error& error) {
    spdlog::info("rank {}: {}", world.rank(), error.what());
    if (world.rank() != 0) return;  // the others only time out
    const std::string expected = "rank " + std::to_string(world.size() - 1) + " failed: cannot load its shard";
    expect(std::strstr(error.what(), expected.c_str()) != nullptr,
           "rank 0 names the failed rank and its cause");
    spdlog::info("failure report case passed");
    return;
  }
  fail("rank {}: the all-reduce without the failed rank returned", world.rank());
}

}  // namespace
}  // namespace beamline

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  beamline::MpiWorld world(mode == "collectives" ? 30.0 : 2.0);
  try {
    if (mode == "collectives") {
      beamline::collectives(world);
      return 0;
    }
    if (mode == "timeout") beamline::timeout(world);
    else if (mode == "failure") beamline::failure(world);
    else beamline::fail("unknown mode {}", mode);
  } catch (const std::exception& error) {
    spdlog::error("rank {}: {}", world.rank(), error.what());
  }
  // The failure cases leave collectives unfinished: end the job.
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

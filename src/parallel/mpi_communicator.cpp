#include "parallel/mpi_communicator.h"

#include <chrono>
#include <cmath>
#include <climits>
#include <limits>
#include <cstring>
#include <numeric>
#include <thread>

#include "util/error.h"

namespace beamline {
namespace {

// Rank 0 only: a failure report that another rank sent (MpiWorld::fail) becomes an Error naming that rank.
void raise_failure_reports() {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank != 0) return;
  int pending = 0;
  MPI_Status status;
  MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, MPI_COMM_WORLD, &pending, &status);
  if (!pending) return;
  int length = 0;
  MPI_Get_count(&status, MPI_CHAR, &length);
  std::string message(static_cast<std::size_t>(length), '\0');
  MPI_Recv(message.data(), length, MPI_CHAR, status.MPI_SOURCE, kFailureTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  fail("rank {} failed: {}", status.MPI_SOURCE, message);
}

int checked_count(std::size_t count, const std::string& what) {
  require(count <= static_cast<std::size_t>(INT_MAX), "{}: {} elements exceed what one MPI call moves", what, count);
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, double timeout_seconds)
      : comm_(comm), name_(std::move(name)), timeout_seconds_(timeout_seconds) {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm_, &rank);
    MPI_Comm_size(comm_, &size);
    rank_ = rank;
    size_ = size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  }
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce_sum(Tensor& tensor) override {
    require_host(tensor, "all_reduce_sum", DType::F32);
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Iallreduce(MPI_IN_PLACE, tensor.raw(), count(tensor.numel(), "all_reduce_sum"), MPI_FLOAT, MPI_SUM, comm_,
                   &request);
    wait(request, "all_reduce_sum");
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    require_host(in, "all_gather", in.dtype());
    require_host(out, "all_gather", in.dtype());
    require(out.numel() == in.numel() * size_, "all_gather in the {}: out {} is not {} x in {}", name_, describe(out),
            size_, describe(in));
    MPI_Request request = MPI_REQUEST_NULL;
    const int bytes = count(in.nbytes(), "all_gather");
    MPI_Iallgather(in.raw(), bytes, MPI_BYTE, out.raw(), bytes, MPI_BYTE, comm_, &request);
    wait(request, "all_gather");
  }

  void all_gather_columns(const Tensor& in, Tensor& out) override {
    require(in.rank() == 2 && out.rank() == 2 && out.dim(0) == in.dim(0) && out.dim(1) == in.dim(1) * size_ &&
                in.dtype() == out.dtype(),
            "all_gather_columns in the {}: out {} is not in {} with {} times the columns", name_, describe(out),
            describe(in), size_);
    std::vector<std::byte> blocks(in.nbytes() * static_cast<std::size_t>(size_));
    Tensor gathered(Device::Cpu, in.dtype(), {size_, in.dim(0), in.dim(1)}, blocks.data(), nullptr);
    all_gather(in, gathered);
    const std::size_t row_bytes = static_cast<std::size_t>(in.dim(1)) * dtype_size(in.dtype());
    for (int64_t r = 0; r < in.dim(0); ++r)
      for (int32_t p = 0; p < size_; ++p)
        std::memcpy(out.raw() + (static_cast<std::size_t>(r) * size_ + p) * row_bytes,
                    blocks.data() + (static_cast<std::size_t>(p) * in.dim(0) + r) * row_bytes, row_bytes);
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    require_host(in, "reduce_scatter_sum", DType::F32);
    require_host(out, "reduce_scatter_sum", DType::F32);
    require(in.numel() == out.numel() * size_, "reduce_scatter_sum in the {}: in {} is not {} x out {}", name_,
            describe(in), size_, describe(out));
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Ireduce_scatter_block(in.raw(), out.raw(), count(out.numel(), "reduce_scatter_sum"), MPI_FLOAT, MPI_SUM, comm_,
                              &request);
    wait(request, "reduce_scatter_sum");
  }

  void all_to_all(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                  std::span<const int64_t> recv_counts) override {
    require_host(in, "all_to_all", in.dtype());
    require_host(out, "all_to_all", in.dtype());
    require(send_counts.size() == static_cast<std::size_t>(size_) && recv_counts.size() == send_counts.size(),
            "all_to_all in the {}: {} send and {} receive counts for {} ranks", name_, send_counts.size(),
            recv_counts.size(), size_);
    const std::size_t element = dtype_size(in.dtype());
    std::vector<int> sends, send_at, receives, receive_at;
    int64_t sent = 0, received = 0;
    for (int32_t p = 0; p < size_; ++p) {
      sends.push_back(count(send_counts[p] * element, "all_to_all"));
      send_at.push_back(count(sent * element, "all_to_all"));
      receives.push_back(count(recv_counts[p] * element, "all_to_all"));
      receive_at.push_back(count(received * element, "all_to_all"));
      sent += send_counts[p];
      received += recv_counts[p];
    }
    require(sent <= in.numel() && received <= out.numel(),
            "all_to_all in the {}: the counts move {} elements from {} into {} for {}", name_, sent, describe(in),
            received, describe(out));
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Ialltoallv(in.raw(), sends.data(), send_at.data(), MPI_BYTE, out.raw(), receives.data(), receive_at.data(),
                   MPI_BYTE, comm_, &request);
    wait(request, "all_to_all");
  }

  void broadcast(Tensor& tensor, int32_t root) override {
    require_host(tensor, "broadcast", tensor.dtype());
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Ibcast(tensor.raw(), count(tensor.nbytes(), "broadcast"), MPI_BYTE, root, comm_, &request);
    wait(request, "broadcast");
  }

  void send(const Tensor& tensor, int32_t peer) override {
    require_host(tensor, "send", tensor.dtype());
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Isend(tensor.raw(), count(tensor.nbytes(), "send"), MPI_BYTE, peer, kTensorTag, comm_, &request);
    wait(request, fmt::format("send to rank {}", peer));
  }

  void recv(Tensor& tensor, int32_t peer) override {
    require_host(tensor, "recv", tensor.dtype());
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Irecv(tensor.raw(), count(tensor.nbytes(), "recv"), MPI_BYTE, peer, kTensorTag, comm_, &request);
    wait(request, fmt::format("receive from rank {}", peer));
  }

  void barrier() override {
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Ibarrier(comm_, &request);
    wait(request, "barrier");
  }

  void broadcast_bytes(std::vector<std::byte>& bytes, int32_t root, bool wait_forever) override {
    int64_t size = static_cast<int64_t>(bytes.size());
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Ibcast(&size, 1, MPI_INT64_T, root, comm_, &request);
    if (wait_forever) {
      wait_for(request, std::numeric_limits<double>::infinity(), "");
    } else {
      wait(request, "broadcast (size)");
    }
    bytes.resize(static_cast<std::size_t>(size));
    MPI_Ibcast(bytes.data(), count(bytes.size(), "broadcast_bytes"), MPI_BYTE, root, comm_, &request);
    wait(request, "broadcast");
  }

  int64_t all_reduce_max(int64_t value) override {
    int64_t result = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Iallreduce(&value, &result, 1, MPI_INT64_T, MPI_MAX, comm_, &request);
    wait(request, "all_reduce_max");
    return result;
  }

 private:
  void require_host(const Tensor& tensor, const char* op, DType dtype) const {
    require(tensor.defined() && tensor.device() == Device::Cpu && tensor.dtype() == dtype,
            "{} in the {}: {} must be a {} tensor in host memory", op, name_, describe(tensor), dtype_name(dtype));
  }
  int count(std::size_t n, const char* op) const { return checked_count(n, fmt::format("{} in the {}", op, name_)); }
  int count(int64_t n, const char* op) const { return count(static_cast<std::size_t>(n), op); }
  void wait(MPI_Request& request, const std::string& op) const {
    wait_for(request, timeout_seconds_, fmt::format("rank {}: {} in the {}", world_rank_, op, name_));
  }

  MPI_Comm comm_;
  std::string name_;
  double timeout_seconds_;
  int32_t rank_ = 0, size_ = 1;
  int world_rank_ = 0;
};

}  // namespace

void wait_for(MPI_Request& request, double timeout_seconds, const std::string& what) {
  const bool bounded = std::isfinite(timeout_seconds);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(bounded ? timeout_seconds : 0.0));
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int status = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    require(status == MPI_SUCCESS, "{}: MPI error {}", what, status);
    if (done) return;
    raise_failure_reports();
    const auto now = std::chrono::steady_clock::now();
    require(!bounded || now < deadline,
            "{}: no answer within --distributed-timeout-seconds {} (a peer is dead, stuck, or running another step)",
            what, timeout_seconds);
    // Spin briefly for the short collectives of a decode step; then yield the core (ranks may share cores).
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(polls > 100000 ? 1000 : 20));
  }
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name, double timeout_seconds) {
  return std::make_unique<MpiCommunicator>(comm, std::move(name), timeout_seconds);
}

}  // namespace beamline

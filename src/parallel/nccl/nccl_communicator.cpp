#include "parallel/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "parallel/staged_communicator.h"
#include "util/error.h"

namespace beamline {
namespace {

// The NCCL functions beamline calls, resolved from libnccl.so.2 once, with the types of the toolkit's nccl.h.
struct NcclLibrary {
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRankConfig) init_rank_config;
  decltype(&ncclCommDestroy) destroy;
  decltype(&ncclCommAbort) abort;
  decltype(&ncclCommGetAsyncError) async_error;
  decltype(&ncclGetErrorString) error_string;
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclAllGather) all_gather;
  decltype(&ncclReduceScatter) reduce_scatter;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;

  static const NcclLibrary& get() {
    static const NcclLibrary library = load();
    return library;
  }

 private:
  static NcclLibrary load() {
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    require(handle != nullptr, "NCCL is needed for more than one GPU and libnccl.so.2 could not be loaded: {}",
            dlerror());
    auto symbol = [handle](const char* name) {
      void* address = dlsym(handle, name);
      require(address != nullptr, "libnccl.so.2 has no {}", name);
      return address;
    };
    NcclLibrary l;
    l.get_unique_id = reinterpret_cast<decltype(l.get_unique_id)>(symbol("ncclGetUniqueId"));
    l.init_rank_config = reinterpret_cast<decltype(l.init_rank_config)>(symbol("ncclCommInitRankConfig"));
    l.destroy = reinterpret_cast<decltype(l.destroy)>(symbol("ncclCommDestroy"));
    l.abort = reinterpret_cast<decltype(l.abort)>(symbol("ncclCommAbort"));
    l.async_error = reinterpret_cast<decltype(l.async_error)>(symbol("ncclCommGetAsyncError"));
    l.error_string = reinterpret_cast<decltype(l.error_string)>(symbol("ncclGetErrorString"));
    l.all_reduce = reinterpret_cast<decltype(l.all_reduce)>(symbol("ncclAllReduce"));
    l.all_gather = reinterpret_cast<decltype(l.all_gather)>(symbol("ncclAllGather"));
    l.reduce_scatter = reinterpret_cast<decltype(l.reduce_scatter)>(symbol("ncclReduceScatter"));
    l.broadcast = reinterpret_cast<decltype(l.broadcast)>(symbol("ncclBroadcast"));
    l.send = reinterpret_cast<decltype(l.send)>(symbol("ncclSend"));
    l.recv = reinterpret_cast<decltype(l.recv)>(symbol("ncclRecv"));
    l.group_start = reinterpret_cast<decltype(l.group_start)>(symbol("ncclGroupStart"));
    l.group_end = reinterpret_cast<decltype(l.group_end)>(symbol("ncclGroupEnd"));
    return l;
  }
};

class NcclCommunicator final : public Communicator {
 public:
  // `host` (may be null) serves the host-value calls; without it they are refused.
  NcclCommunicator(const ncclUniqueId& id, int32_t rank, int32_t size, std::string name,
                   std::unique_ptr<Communicator> host, Backend& backend, double timeout_seconds)
      : host_(std::move(host)), rank_(rank), size_(size), name_(std::move(name)), backend_(backend),
        nccl_(NcclLibrary::get()), timeout_seconds_(timeout_seconds) {
    require(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess, "{}: cudaStreamCreate failed",
            name_);
    // Nonblocking initialisation, polled like every op, so that a peer that never joins is a timeout.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t result = nccl_.init_rank_config(&comm_, size_, id, rank_, &config);
    if (result != ncclInProgress) check(result, "ncclCommInitRankConfig");
    wait_comm("ncclCommInitRank");
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) (aborted_ ? nccl_.abort : nccl_.destroy)(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce_sum(Tensor& tensor) override {
    require_device(tensor, "all_reduce_sum", true);
    run("all_reduce_sum", [&] {
      return nccl_.all_reduce(tensor.raw(), tensor.raw(), static_cast<std::size_t>(tensor.numel()), ncclFloat32,
                              ncclSum, comm_, stream_);
    });
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    require_device(in, "all_gather", false);
    require_device(out, "all_gather", false);
    require(out.nbytes() == in.nbytes() * static_cast<std::size_t>(size()), "all_gather in the {}: out {} is not {} x in {}",
            name(), describe(out), size(), describe(in));
    run("all_gather", [&] { return nccl_.all_gather(in.raw(), out.raw(), in.nbytes(), ncclUint8, comm_, stream_); });
  }

  void all_gather_columns(const Tensor& in, Tensor& out) override {
    require(in.rank() == 2 && out.rank() == 2 && out.dim(0) == in.dim(0) && out.dim(1) == in.dim(1) * size() &&
                in.dtype() == out.dtype(),
            "all_gather_columns in the {}: out {} is not in {} with {} times the columns", name(), describe(out),
            describe(in), size());
    Tensor blocks = backend_.alloc(in.dtype(), {size(), in.dim(0), in.dim(1)});
    all_gather(in, blocks);
    const std::size_t row_bytes = static_cast<std::size_t>(in.dim(1)) * dtype_size(in.dtype());
    for (int32_t p = 0; p < size(); ++p)
      cuda_check(cudaMemcpy2DAsync(out.raw() + p * row_bytes, row_bytes * static_cast<std::size_t>(size()),
                                   blocks.raw() + static_cast<std::size_t>(p) * in.nbytes(), row_bytes, row_bytes,
                                   static_cast<std::size_t>(in.dim(0)), cudaMemcpyDeviceToDevice, stream_),
                 "all_gather_columns");
    wait_stream("all_gather_columns");
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    require_device(in, "reduce_scatter_sum", true);
    require_device(out, "reduce_scatter_sum", true);
    require(in.numel() == out.numel() * size(), "reduce_scatter_sum in the {}: in {} is not {} x out {}", name(),
            describe(in), size(), describe(out));
    run("reduce_scatter_sum", [&] {
      return nccl_.reduce_scatter(in.raw(), out.raw(), static_cast<std::size_t>(out.numel()), ncclFloat32, ncclSum,
                                  comm_, stream_);
    });
  }

  void all_to_all(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                  std::span<const int64_t> recv_counts) override {
    require_device(in, "all_to_all", false);
    require_device(out, "all_to_all", false);
    require(send_counts.size() == static_cast<std::size_t>(size()) && recv_counts.size() == send_counts.size(),
            "all_to_all in the {}: {} send and {} receive counts for {} ranks", name(), send_counts.size(),
            recv_counts.size(), size());
    const std::size_t element = dtype_size(in.dtype());
    run("all_to_all", [&] {
      ncclResult_t result = nccl_.group_start();
      std::size_t sent = 0, received = 0;
      for (int32_t p = 0; p < size() && result == ncclSuccess; ++p) {
        const auto send_bytes = static_cast<std::size_t>(send_counts[p]) * element;
        const auto recv_bytes = static_cast<std::size_t>(recv_counts[p]) * element;
        result = nccl_.send(in.raw() + sent, send_bytes, ncclUint8, p, comm_, stream_);
        if (result == ncclSuccess) result = nccl_.recv(out.raw() + received, recv_bytes, ncclUint8, p, comm_, stream_);
        sent += send_bytes;
        received += recv_bytes;
      }
      const ncclResult_t end = nccl_.group_end();
      return result != ncclSuccess ? result : end;
    });
  }

  void broadcast(Tensor& tensor, int32_t root) override {
    require_device(tensor, "broadcast", false);
    run("broadcast", [&] {
      return nccl_.broadcast(tensor.raw(), tensor.raw(), tensor.nbytes(), ncclUint8, root, comm_, stream_);
    });
  }

  void send(const Tensor& tensor, int32_t peer) override {
    require_device(tensor, "send", false);
    run("send", [&] { return nccl_.send(tensor.raw(), tensor.nbytes(), ncclUint8, peer, comm_, stream_); });
  }

  void recv(Tensor& tensor, int32_t peer) override {
    require_device(tensor, "recv", false);
    run("recv", [&] { return nccl_.recv(tensor.raw(), tensor.nbytes(), ncclUint8, peer, comm_, stream_); });
  }

  void barrier() override { host("barrier").barrier(); }
  void broadcast_bytes(std::vector<std::byte>& bytes, int32_t root, bool wait_forever) override {
    host("broadcast_bytes").broadcast_bytes(bytes, root, wait_forever);
  }
  int64_t all_reduce_max(int64_t value) override { return host("all_reduce_max").all_reduce_max(value); }

 private:
  Communicator& host(const char* op) const {
    require(host_ != nullptr, "{} in the {}: this group has no host communicator", op, name());
    return *host_;
  }
  void require_device(const Tensor& tensor, const char* op, bool f32) const {
    require(tensor.defined() && tensor.device() == Device::Cuda && (!f32 || tensor.dtype() == DType::F32),
            "{} in the {}: {} must be a{} CUDA tensor", op, name(), describe(tensor), f32 ? "n F32" : "");
  }
  void check(ncclResult_t result, const char* what) const {
    require(result == ncclSuccess, "{} in the {}: {}", what, name(), nccl_.error_string(result));
  }
  void cuda_check(cudaError_t result, const char* what) const {
    require(result == cudaSuccess, "{} in the {}: {}", what, name(), cudaGetErrorString(result));
  }
  // The backend's queued work first (its stream is its own), then the op on ours, then the wait.
  template <typename Launch>
  void run(const char* op, Launch launch) {
    backend_.synchronize();
    const ncclResult_t result = launch();
    if (result != ncclInProgress) check(result, op);
    wait_stream(op);
  }
  void wait_comm(const char* op) {
    poll(op, [&] {
      ncclResult_t state = ncclSuccess;
      check(nccl_.async_error(comm_, &state), op);
      if (state != ncclInProgress) check(state, op);
      return state == ncclSuccess;
    });
  }
  void wait_stream(const char* op) {
    poll(op, [&] {
      ncclResult_t state = ncclSuccess;
      check(nccl_.async_error(comm_, &state), op);
      if (state != ncclInProgress) check(state, op);
      const cudaError_t query = cudaStreamQuery(stream_);
      if (query != cudaErrorNotReady) cuda_check(query, op);
      return query == cudaSuccess;
    });
  }
  template <typename Done>
  void poll(const char* op, Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds_);
    for (int polls = 0; !done(); ++polls) {
      if (std::chrono::steady_clock::now() >= deadline) {
        aborted_ = true;
        fail("{} in the {}: no answer within --distributed-timeout-seconds {} (a peer is dead, stuck, or running "
             "another step)",
             op, name(), timeout_seconds_);
      }
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  std::unique_ptr<Communicator> host_;
  int32_t rank_, size_;
  std::string name_;
  Backend& backend_;
  const NcclLibrary& nccl_;
  double timeout_seconds_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
};

// Whether two ranks of `host`'s group use one GPU (by UUID; each rank's current device). Collective over the group.
bool ranks_share_a_gpu(Communicator& host) {
  int device = 0;
  cudaDeviceProp properties{};
  require(cudaGetDevice(&device) == cudaSuccess &&
              cudaGetDeviceProperties(&properties, device) == cudaSuccess,
          "{}: rank {} cannot read its GPU's properties", host.name(), host.rank());
  std::set<std::string> uuids;
  for (int32_t root = 0; root < host.size(); ++root) {
    std::vector<std::byte> bytes;
    if (root == host.rank()) {
      bytes.resize(sizeof properties.uuid);
      std::memcpy(bytes.data(), &properties.uuid, sizeof properties.uuid);
    }
    host.broadcast_bytes(bytes, root);
    uuids.emplace(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  return uuids.size() < static_cast<std::size_t>(host.size());
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host, Backend& backend,
                                                     double timeout_seconds) {
  if (host->size() > 1 && ranks_share_a_gpu(*host)) {
    if (host->rank() == 0)
      spdlog::warn("{}: its ranks share a GPU, which NCCL refuses: its collectives go through host memory over MPI "
                   "(for tests and measurements on one device, not a fast path)",
                   host->name());
    return make_staged_communicator(std::move(host), backend);
  }
  ncclUniqueId id{};
  if (host->rank() == 0) {
    const ncclResult_t result = NcclLibrary::get().get_unique_id(&id);
    require(result == ncclSuccess, "ncclGetUniqueId in the {}: {}", host->name(), NcclLibrary::get().error_string(result));
  }
  std::vector<std::byte> bytes(sizeof id);
  std::memcpy(bytes.data(), &id, sizeof id);
  host->broadcast_bytes(bytes, 0);
  std::memcpy(&id, bytes.data(), sizeof id);
  const int32_t rank = host->rank(), size = host->size();
  std::string name = host->name();
  return std::make_unique<NcclCommunicator>(id, rank, size, std::move(name), std::move(host), backend, timeout_seconds);
}

std::unique_ptr<Communicator> make_nccl_communicator(std::span<const std::byte> unique_id, int32_t rank, int32_t size,
                                                     std::string name, Backend& backend, double timeout_seconds) {
  ncclUniqueId id{};
  require(unique_id.size() == sizeof id, "{}: an ncclUniqueId has {} bytes, got {}", name, sizeof id, unique_id.size());
  std::memcpy(&id, unique_id.data(), sizeof id);
  return std::make_unique<NcclCommunicator>(id, rank, size, std::move(name), nullptr, backend, timeout_seconds);
}

}  // namespace beamline

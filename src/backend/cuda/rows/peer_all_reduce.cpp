#include "backend/cuda/rows/peer_all_reduce.h"

#include <cuda_runtime.h>

#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/rows/all_reduce_norm.h"
#include "backend/op_checks.h"
#include "util/error.h"

namespace beamline {
namespace {

// The partial rows start past the signal, on a 256-byte boundary.
constexpr std::size_t kPartialOffset = (sizeof(cuda::AllReduceSignal) + 255) / 256 * 256;
constexpr std::size_t kPartialBytes = sizeof(float) * cuda::kAllReduceMaxRows * cuda::kAllReduceMaxHidden;

// What a rank's handle carries: its memory's IPC handle, then the identity of its GPU. Two ranks on one GPU must not
// spin on each other's flags unless MPS runs their kernels side by side: without it, the GPU time-slices the two
// processes and each kernel waits for one that cannot start (the kernel traps after its timeout).
struct PeerHandle {
  cudaIpcMemHandle_t memory;
  char gpu_uuid[16];
  int32_t mps;  // cudaDevAttrMpsEnabled of this rank's GPU
};

void check_cuda(cudaError_t status, const char* what) {
  require(status == cudaSuccess, "peer all-reduce: {} failed: {} ({})", what, cudaGetErrorName(status),
          cudaGetErrorString(status));
}

class CudaPeerAllReduce final : public PeerAllReduce {
 public:
  explicit CudaPeerAllReduce(CudaBackend& backend) : backend_(backend) {
    backend_.synchronize();
    check_cuda(cudaMalloc(&memory_, kPartialOffset + kPartialBytes), "cudaMalloc of the shared buffer");
    // Zeroed and complete before any peer can map it (the epochs start at 0 on every rank).
    check_cuda(cudaMemset(memory_, 0, kPartialOffset + kPartialBytes), "cudaMemset of the shared buffer");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after zeroing the shared buffer");
  }

  ~CudaPeerAllReduce() override {
    for (void* mapped : mapped_)
      if (mapped != nullptr) cudaIpcCloseMemHandle(mapped);
    cudaFree(memory_);
  }

  int64_t max_rows() const override { return cuda::kAllReduceMaxRows; }
  int64_t max_hidden() const override { return cuda::kAllReduceMaxHidden; }

  std::vector<std::byte> handle() const override {
    PeerHandle handle{};
    check_cuda(cudaIpcGetMemHandle(&handle.memory, memory_), "cudaIpcGetMemHandle");
    const GpuIdentity gpu = gpu_identity();
    std::memcpy(handle.gpu_uuid, gpu.uuid, sizeof handle.gpu_uuid);
    handle.mps = gpu.mps;
    std::vector<std::byte> bytes(sizeof handle);
    std::memcpy(bytes.data(), &handle, sizeof handle);
    return bytes;
  }

  void connect(std::span<const std::vector<std::byte>> handles, int32_t rank) override {
    const auto ranks = static_cast<int32_t>(handles.size());
    require(ranks >= 1 && ranks <= cuda::kAllReduceMaxRanks && rank >= 0 && rank < ranks,
            "peer all-reduce: rank {} of {} (1 to {} ranks)", rank, ranks, cuda::kAllReduceMaxRanks);
    const GpuIdentity gpu = gpu_identity();
    std::vector<PeerHandle> peer_handles(handles.size());
    for (int32_t p = 0; p < ranks; ++p) {
      if (p == rank) continue;
      const std::vector<std::byte>& bytes = handles[static_cast<std::size_t>(p)];
      PeerHandle& handle = peer_handles[static_cast<std::size_t>(p)];
      require(bytes.size() == sizeof handle, "peer all-reduce: rank {}'s handle has {} bytes, expected {}", p,
              bytes.size(), sizeof handle);
      std::memcpy(&handle, bytes.data(), sizeof handle);
      require(std::memcmp(handle.gpu_uuid, gpu.uuid, sizeof gpu.uuid) != 0 || (handle.mps != 0 && gpu.mps != 0),
              "peer all-reduce: ranks {} and {} share one GPU without MPS: the fused kernel needs a GPU per rank "
              "(or MPS, which runs both ranks' kernels at once)",
              rank, p);
    }
    peers_ = {};
    peers_.ranks = ranks;
    peers_.rank = rank;
    for (int32_t p = 0; p < ranks; ++p) {
      std::byte* base = static_cast<std::byte*>(memory_);
      if (p != rank) {
        void* mapped = nullptr;
        const cudaError_t status =
            cudaIpcOpenMemHandle(&mapped, peer_handles[static_cast<std::size_t>(p)].memory, cudaIpcMemLazyEnablePeerAccess);
        require(status == cudaSuccess, "peer all-reduce: rank {} cannot map rank {}'s memory: cudaIpcOpenMemHandle: {} ({})",
                rank, p, cudaGetErrorName(status), cudaGetErrorString(status));
        mapped_.push_back(mapped);
        base = static_cast<std::byte*>(mapped);
      }
      peers_.signal[p] = reinterpret_cast<cuda::AllReduceSignal*>(base);
      peers_.partial[p] = reinterpret_cast<const float*>(base + kPartialOffset);
    }
  }

  Tensor partial(int64_t rows, int64_t hidden) override {
    require(rows >= 0 && rows <= max_rows() && hidden >= 1 && hidden <= max_hidden(),
            "peer all-reduce: a partial of [{}, {}] exceeds [{}, {}]", rows, hidden, max_rows(), max_hidden());
    // Borrowed: the memory lives as long as this object, which the parallel groups keep past every model.
    return Tensor(Device::Cuda, DType::F32, {rows, hidden}, static_cast<std::byte*>(memory_) + kPartialOffset, nullptr);
  }

  void add_rms_norm(Tensor& residual, const Tensor& weight, float eps, float scale, const Tensor& next_weight,
                    Tensor& out) override {
    constexpr const char* op = "peer all_reduce_add_rms_norm";
    require(peers_.ranks > 0, "{}: connect() first", op);
    require(residual.rank() == 2, "{}: residual must be [T, H], got {}", op, describe(residual));
    const Tensor own = partial(residual.dim(0), residual.dim(1));
    check_all_reduce_add_rms_norm_args(std::span(&own, 1), residual, weight, next_weight, out);
    require(residual.device() == Device::Cuda && weight.device() == Device::Cuda &&
                (!out.defined() || (out.device() == Device::Cuda && next_weight.device() == Device::Cuda)),
            "{}: residual, weights and out must be CUDA tensors", op);
    const cudaError_t status = cuda::all_reduce_add_rms_norm(
        peers_, residual.data<float>(), weight.raw(), out.defined() ? next_weight.raw() : nullptr, weight.dtype(), eps,
        scale, residual.dim(0), residual.dim(1), out.defined() ? out.data<float>() : nullptr, backend_.stream());
    require(status == cudaSuccess, "{}: kernel launch failed: {} ({}); weights {}", op, cudaGetErrorName(status),
            cudaGetErrorString(status), dtype_name(weight.dtype()));
  }

 private:
  struct GpuIdentity {
    char uuid[16];
    int32_t mps;
  };
  static GpuIdentity gpu_identity() {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    GpuIdentity gpu{};
    std::memcpy(gpu.uuid, properties.uuid.bytes, sizeof gpu.uuid);
    check_cuda(cudaDeviceGetAttribute(&gpu.mps, cudaDevAttrMpsEnabled, device), "cudaDeviceGetAttribute(MpsEnabled)");
    return gpu;
  }

  CudaBackend& backend_;
  void* memory_ = nullptr;           // this rank's signal, then its partial rows
  std::vector<void*> mapped_;        // the peers' memory, mapped
  cuda::AllReducePeers peers_;
};

}  // namespace

std::unique_ptr<PeerAllReduce> make_cuda_peer_all_reduce(CudaBackend& backend) {
  return std::make_unique<CudaPeerAllReduce>(backend);
}

}  // namespace beamline

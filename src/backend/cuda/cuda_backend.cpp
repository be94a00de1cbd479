#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "backend/cuda/rows/all_reduce_norm.h"
#include "backend/cuda/rows/peer_all_reduce.h"
#include "backend/cuda/rows/rows.h"
#include "backend/cuda/linear/projection.h"
#include "backend/cuda/linear/row_invariant.h"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/common/kernel_variant.h"
#include "backend/cuda/lora/lora.h"
#include "backend/cuda/lora/moe_lora.h"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/moe/router.h"
#include "backend/cuda/sampling/sampling.h"
#include "backend/cuda/sampling/token_mask.h"
#include "backend/cuda/quant/fp8.h"
#include "backend/cuda/quant/fp8_cublaslt.h"
#include "backend/cuda/quant/micro.h"
#include "backend/op_checks.h"
#include "backend/registry.h"
#include "util/error.h"

namespace beamline {
namespace {

constexpr std::size_t kCublasWorkspaceBytes = 32u << 20;
constexpr std::size_t kWeightLogInterval = 1ull << 30;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuda backend: {} failed: {}", what, cublasGetStatusString(status));
}
#define BEAMLINE_CUBLAS_CHECK(expr) check_cublas((expr), #expr)

void check_launch(cudaError_t status, std::string_view op) {
  if (status != cudaSuccess)
    fail("cuda backend: {}: kernel launch failed: {} ({})", op, cudaGetErrorName(status), cudaGetErrorString(status));
}

void require_device(const Tensor& tensor, std::string_view op, std::string_view what) {
  require(tensor.defined(), "{}: {} is not allocated", op, what);
  require(tensor.device() == Device::Cuda, "{}: {} is not a CUDA tensor", op, what);
}

void require_float_weight(const Tensor& weight, std::string_view op, std::string_view what) {
  require_device(weight, op, what);
  const DType dtype = weight.dtype();
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16, "{}: {} is {}, expected F32, BF16 or F16",
          op, what, dtype_name(dtype));
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

cuda::RouterChoice router_choice(const RouterParams& params) {
  return {params.n_group, params.topk_group, params.top_k, params.norm_topk_prob, params.routed_scaling_factor};
}

void require_unquantized(const LinearTensors& weight, std::string_view op) {
  require(!weight.scale.defined(),
          "{}: weight {} with scale {} is none of the quantized layouts (F8_E4M3 + F32 block-128 scales, F8_E4M3 + "
          "F8_E8M0 per-32 scales, U8 packed E2M1 + F8_E4M3 per-16 scales + F32 scale_2)",
          op, describe(weight.weight), weight.scale.defined() ? describe(weight.scale) : std::string());
}

// FP8 block-128 (MODEL_FORMAT.md section 5 "fp8"): E4M3 [out, in] with F32 scales [ceil(out/128), ceil(in/128)].
// E4M3 codes with E8M0 (or U8) scales are MXFP8 (micro_format below).
bool is_fp8_block(const LinearTensors& weight) {
  const bool per_32 = weight.scale.defined() && (weight.scale.dtype() == DType::F8_E8M0 || weight.scale.dtype() == DType::U8);
  return weight.weight.dtype() == DType::F8_E4M3 && !per_32;
}

void check_fp8_block(const LinearTensors& weight, std::string_view op) {
  require_device(weight.weight, op, "weight");
  require(weight.weight.rank() == 2, "{}: weight must be [out, in], got {}", op, describe(weight.weight));
  const int64_t out = weight.weight.dim(0), in = weight.weight.dim(1);
  require(weight.scale.defined(), "{}: FP8 weight {} has no block scales", op, describe(weight.weight));
  require_device(weight.scale, op, "weight scale");
  require(weight.scale.dtype() == DType::F32 && !weight.scale_2.defined(),
          "{}: weight {} with scale {} is none of the layouts of FP8 codes (F32 block-128 scales, E8M0 per-32 scales)",
          op, describe(weight.weight), describe(weight.scale));
  require_shape(weight.scale, {cuda::fp8::blocks_of(out), cuda::fp8::blocks_of(in)}, op, "weight scale");
  require(cuda::fp8::gemm_supported(in) && aligned16(weight.weight.raw()),
          "{}: FP8 weight {} needs in_features a multiple of 16 on the cuda backend", op, describe(weight.weight));
}

// MXFP8 (E4M3 codes, E8M0 or U8 scales per 32) and NVFP4 (U8 packed E2M1, E4M3 scales per 16, F32 scale_2): the
// layouts with a scale per few elements of a row (backend/cuda/quant/micro.h). nullopt for any other weight.
std::optional<cuda::micro::Format> micro_format(const LinearTensors& weight) {
  if (!weight.scale.defined()) return std::nullopt;
  const DType codes = weight.weight.dtype(), scales = weight.scale.dtype();
  if (codes == DType::F8_E4M3 && (scales == DType::F8_E8M0 || scales == DType::U8)) return cuda::micro::Format::Mxfp8;
  if (codes == DType::U8 && scales == DType::F8_E4M3) return cuda::micro::Format::Nvfp4;
  return std::nullopt;
}

const char* format_name(cuda::micro::Format format) {
  return format == cuda::micro::Format::Mxfp8 ? "MXFP8" : "NVFP4";
}

// in_features of the logical [out, in] matrix (NVFP4 stores two codes a byte).
int64_t logical_in(const LinearTensors& weight) {
  const std::optional<cuda::micro::Format> format = micro_format(weight);
  return format == cuda::micro::Format::Nvfp4 ? 2 * weight.weight.dim(1) : weight.weight.dim(1);
}

void check_micro(const LinearTensors& weight, std::string_view op) {
  const cuda::micro::Format format = *micro_format(weight);
  require_device(weight.weight, op, "weight");
  require_device(weight.scale, op, "weight scale");
  require(weight.weight.rank() == 2, "{}: weight must be [out, in], got {}", op, describe(weight.weight));
  const int64_t out = weight.weight.dim(0), in = logical_in(weight), group = cuda::micro::group_size(format);
  require(cuda::micro::supported(format, in), "{}: {} weight {} needs in_features ({}) a multiple of {}", op,
          format_name(format), describe(weight.weight), in, group);
  require_shape(weight.scale, {out, in / group}, op, "weight scale");
  if (format == cuda::micro::Format::Nvfp4) {
    require(weight.scale_2.defined() && weight.scale_2.dtype() == DType::F32 && weight.scale_2.numel() == 1,
            "{}: NVFP4 weight {} needs an F32 scalar scale_2, got {}", op, describe(weight.weight),
            weight.scale_2.defined() ? describe(weight.scale_2) : std::string("none"));
    require_device(weight.scale_2, op, "weight scale_2");
  } else {
    require(!weight.scale_2.defined(), "{}: MXFP8 weight {} has a scale_2 {} that the layout does not use", op,
            describe(weight.weight), describe(weight.scale_2));
  }
  require(aligned16(weight.weight.raw()), "{}: {} weight {} is not 16-byte aligned on the device", op,
          format_name(format), describe(weight.weight));
}

cuda::micro::Weight micro_weight(const LinearTensors& weight) {
  const bool nvfp4 = micro_format(weight) == cuda::micro::Format::Nvfp4;
  return {reinterpret_cast<const uint8_t*>(weight.weight.raw()), reinterpret_cast<const uint8_t*>(weight.scale.raw()),
          nvfp4 ? weight.scale_2.data<const float>() : nullptr};
}

// --batch-invariant's projections: the FP8, MXFP8 and NVFP4 paths choose their kernels by rows and have no row-invariant
// configuration yet.
void require_row_invariant(const LinearTensors& weight, std::string_view op) {
  require(!is_fp8_block(weight) && !micro_format(weight),
          "{}: --batch-invariant on cuda takes BF16, F16 or F32 weights, not {} (the quantized formats have no "
          "row-invariant kernels yet; leave --quantization off or the flag off)",
          op, describe(weight.weight));
}

int to_int(int64_t value, std::string_view what) {
  require(value >= 0 && value <= std::numeric_limits<int>::max(), "cuda backend: {} = {} is out of cuBLAS's range",
          what, value);
  return static_cast<int>(value);
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      fail("cuda backend: no cuBLAS type for {}", dtype_name(dtype));
  }
}

void check_pool(const PagedKvPool& pool, int32_t slot, std::string_view op) {
  require_device(pool.k, op, "k pool");
  require_device(pool.v, op, "v pool");
  if (pool.scales.defined()) require_device(pool.scales, op, "KV scales");
  check_kv_pool(pool, slot, op);
}

cuda::PoolGeometry pool_geometry(const PagedKvPool& pool) {
  cuda::PoolGeometry geometry;
  geometry.k = pool.k.raw();
  geometry.v = pool.v.raw();
  geometry.dtype = pool.k.dtype();
  geometry.num_blocks = pool.num_blocks();
  geometry.slots_per_block = pool.slots_per_block();
  geometry.block_size = pool.block_size();
  geometry.num_kv_heads = pool.num_kv_heads();
  geometry.head_dim = pool.head_dim();
  if (geometry.dtype == DType::F8_E4M3 && pool.scales.defined()) geometry.scales = pool.scales.data<const float>();
  return geometry;
}

cuda::BatchGeometry batch_geometry(const AttentionBatch& batch, const Tensor& block_table, std::string_view op) {
  require(block_table.rank() == 2 && block_table.dim(0) == batch.num_sequences(),
          "{}: block table {} does not have one row per sequence ({})", op, describe(block_table),
          batch.num_sequences());
  require_dtype(block_table, DType::I32, op, "block table");
  require_device(block_table, op, "block table");
  require_device(batch.positions, op, "batch positions");
  cuda::BatchGeometry geometry;
  geometry.positions = batch.positions.data<const int32_t>();
  geometry.row_sequence = batch.row_sequence.data<const int32_t>();
  geometry.seq_lens = batch.seq_lens.data<const int32_t>();
  geometry.block_table = block_table.data<const int32_t>();
  geometry.rows = batch.num_rows();
  geometry.table_width = static_cast<int32_t>(block_table.dim(1));
  return geometry;
}

}  // namespace

// The device pointer tables of one MoE layer's experts, made by prepare_moe.
struct PackedExperts {
  Tensor pointers;     // I64 [3, E]: gate, up, down
  Tensor tensor_maps;  // U8 [3, E, kTensorMapBytes] of the same matrices when the wgmma GEMMs can take them
  Tensor scale_pointers;  // FP8, MXFP8, NVFP4: I64 [3, E], the scales of the same matrices
  Tensor scale_2_pointers;  // NVFP4: I64 [3, E], the per-tensor scale_2 of the same matrices
  std::optional<cuda::micro::Format> micro;  // MXFP8 or NVFP4 experts
  bool scales_aligned = false;                // MXFP8, NVFP4: every scale tensor 4-byte aligned
  DType dtype = DType::BF16;
  int64_t hidden = 0, intermediate = 0;
};

namespace {

// The kernels' view of BF16 or F16 experts.
cuda::ExpertPointers expert_pointers(const PackedExperts& packed) {
  cuda::ExpertPointers pointers;
  const auto experts = static_cast<int32_t>(packed.pointers.dim(1));
  const auto* table = packed.pointers.data<const void* const>();
  pointers.gate = table;
  pointers.up = table + experts;
  pointers.down = table + 2 * int64_t{experts};
  pointers.dtype = packed.dtype;
  pointers.experts = experts;
  pointers.hidden = packed.hidden;
  pointers.intermediate = packed.intermediate;
  pointers.tensor_maps = packed.tensor_maps.defined() ? packed.tensor_maps.raw() : nullptr;
  return pointers;
}

void check_swiglu(const SwigluTensors& mlp, int64_t hidden, std::string_view op) {
  if (const std::optional<cuda::micro::Format> format = micro_format(mlp.gate)) {
    for (const LinearTensors* w : {&mlp.gate, &mlp.up, &mlp.down}) {
      require(micro_format(*w) == format, "{}: gate is {}, {} with scale {} is not", op, format_name(*format),
              describe(w->weight), w->scale.defined() ? describe(w->scale) : std::string("none"));
      check_micro(*w, op);
    }
    const int64_t intermediate = mlp.gate.weight.dim(0);
    require(logical_in(mlp.gate) == hidden && logical_in(mlp.up) == hidden && mlp.up.weight.dim(0) == intermediate,
            "{}: gate {} and up {} must both be [{}, {}] ({})", op, describe(mlp.gate.weight), describe(mlp.up.weight),
            intermediate, hidden, format_name(*format));
    require(mlp.down.weight.dim(0) == hidden && logical_in(mlp.down) == intermediate,
            "{}: down {} must be [{}, {}] ({})", op, describe(mlp.down.weight), hidden, intermediate,
            format_name(*format));
    return;
  }
  if (is_fp8_block(mlp.gate)) {
    for (const LinearTensors* w : {&mlp.gate, &mlp.up, &mlp.down}) {
      require(is_fp8_block(*w), "{}: gate is FP8, {} is not", op, describe(w->weight));
      check_fp8_block(*w, op);
    }
    const int64_t intermediate = mlp.gate.weight.dim(0);
    require_shape(mlp.gate.weight, {intermediate, hidden}, op, "gate");
    require_shape(mlp.up.weight, {intermediate, hidden}, op, "up");
    require_shape(mlp.down.weight, {hidden, intermediate}, op, "down");
    return;
  }
  for (const LinearTensors* w : {&mlp.gate, &mlp.up, &mlp.down}) {
    require_device(w->weight, op, "expert weight");
    require(w->weight.rank() == 2, "{}: expert weight {} is not a matrix", op, describe(w->weight));
    require_unquantized(*w, op);
    require(w->weight.dtype() == DType::BF16 || w->weight.dtype() == DType::F16,
            "{}: weight {} must be BF16 or F16 on the cuda backend (its tensor-core GEMMs)", op,
            describe(w->weight));
    require_dtype(w->weight, mlp.gate.weight.dtype(), op, "expert weight");
  }
  const int64_t intermediate = mlp.gate.weight.dim(0);
  require_shape(mlp.gate.weight, {intermediate, hidden}, op, "gate");
  require_shape(mlp.up.weight, {intermediate, hidden}, op, "up");
  require_shape(mlp.down.weight, {hidden, intermediate}, op, "down");
}

void check_linear(const Tensor& x, const LinearTensors& weight, const Tensor& y, std::string_view op) {
  if (micro_format(weight)) {
    check_micro(weight, op);
  } else if (is_fp8_block(weight)) {
    check_fp8_block(weight, op);
  } else {
    require_unquantized(weight, op);
    require_float_weight(weight.weight, op, "weight");
  }
  require(weight.weight.rank() == 2, "{}: weight must be [out, in], got {}", op, describe(weight.weight));
  const int64_t rows = x.dim(0), out = weight.weight.dim(0), in = logical_in(weight);
  require_device(x, op, "x");
  require_shape(x, {rows, in}, op, "x");
  require_shape(y, {rows, out}, op, "y");
  require_dtype(x, DType::F32, op, "x");
  require_dtype(y, DType::F32, op, "y");
}

struct Registration {
  Registration() {
    register_backend("cuda", [] { return make_cuda_backend(); }, [](Backend& backend) {
      return make_cuda_peer_all_reduce(dynamic_cast<CudaBackend&>(backend));
    });
  }
} registration;

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

CudaBackend::CudaBackend(int device) : device_(device) {
  cuda::check_kernel_variants();  // a misspelt BEAMLINE_CUDA_<FAMILY> fails here, not as a silent default
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  require(status == cudaSuccess && count > device,
          "device 'cuda': no usable CUDA device {} ({}; {} devices found). Use --device cpu on this machine", device,
          status == cudaSuccess ? "no error" : cudaGetErrorString(status), count);
  BEAMLINE_CUDA_CHECK(cudaSetDevice(device_));
  BEAMLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  BEAMLINE_CUBLAS_CHECK(cublasCreate(&cublas_));
  BEAMLINE_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // Default math: BF16/F16 GEMMs on the tensor cores, FP32 GEMMs (router, F32 weights) in true FP32 (no TF32).
  BEAMLINE_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  cublas_workspace_ = alloc(DType::U8, {static_cast<int64_t>(kCublasWorkspaceBytes)});
  BEAMLINE_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.raw(), kCublasWorkspaceBytes));
  staging_ = std::make_unique<cuda::PinnedStaging>(stream_);
  route_arrivals_ = alloc(DType::I32, {1});
  fill_zero(route_arrivals_);
  fp8_gemm_ = std::make_unique<cuda::fp8::BlockScaledGemm>(cublas_workspace_.raw(), kCublasWorkspaceBytes);
  if (const char* rows = std::getenv("BEAMLINE_CUDA_FP8_CUBLAS_ROWS")) fp8_cublas_min_rows_ = std::max(0, std::atoi(rows));
  // An override of the streaming crossover (0: cuBLAS at every row count), for A/B runs of whole decode steps.
  if (const char* rows = std::getenv("BEAMLINE_CUDA_STREAMING_ROWS")) streaming_max_rows_ = std::max(0, std::atoi(rows));
  if (const char* times = std::getenv("BEAMLINE_CUDA_OP_TIMES"); times != nullptr && std::string_view(times) == "1")
    op_times_ = std::make_unique<cuda::OpTimes>(stream_);
  spdlog::info("cuda backend: {}", device_description());
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  if (op_times_) {
    op_times_->resolve();
    spdlog::info("cuda backend: {}", op_times_->table());
    op_times_.reset();
  }
  const cuda::AllocatorStats stats = allocator_.stats();
  spdlog::info("cuda backend: {} device allocations, {:.1f} MiB reserved ({:.1f} MiB graph pool); weights {:.1f} MiB "
               "in {} allocation(s)",
                stats.device_allocations, static_cast<double>(stats.reserved_bytes) / (1 << 20),
                static_cast<double>(stats.graph_pool_bytes) / (1 << 20),
                static_cast<double>(weights_.bytes_used()) / (1 << 20), weights_.chunks());
  staging_.reset();
  fp8_gemm_.reset();
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

std::string CudaBackend::device_description() const {
  cudaDeviceProp properties{};
  BEAMLINE_CUDA_CHECK(cudaGetDeviceProperties(&properties, device_));
  return fmt::format("{} (sm_{}{}, {} SMs, {:.0f} GiB)", properties.name, properties.major, properties.minor,
                     properties.multiProcessorCount, static_cast<double>(properties.totalGlobalMem) / (1ull << 30));
}

// ---- memory ----

Tensor CudaBackend::alloc(DType dtype, std::vector<int64_t> shape) {
  for (int64_t d : shape) require(d >= 0, "alloc: negative dimension in shape {}", shape_string(shape));
  Tensor probe(Device::Cuda, dtype, shape, nullptr, nullptr);
  std::shared_ptr<void> storage = allocator_.allocate(probe.nbytes());
  auto* data = static_cast<std::byte*>(storage.get());
  return Tensor(Device::Cuda, dtype, std::move(shape), data, std::move(storage));
}

void CudaBackend::fill_zero(Tensor& tensor) {
  require_device(tensor, "fill_zero", "tensor");
  BEAMLINE_CUDA_CHECK(cudaMemsetAsync(tensor.raw(), 0, tensor.nbytes(), stream_));
}

// A copy from the pinned staging ring cannot be part of a recorded graph: a replay would copy whatever that slot
// holds by then.
void CudaBackend::require_not_capturing(std::string_view op) const {
  require(!capturing_, "{}: a host-to-device copy cannot be recorded into a graph (make it before "
          "begin_capture)", op);
}

Tensor CudaBackend::upload(const void* host, DType dtype, std::vector<int64_t> shape) {
  const auto timing = time_op("upload");
  require_not_capturing("upload");
  Tensor tensor = alloc(dtype, std::move(shape));
  staging_->copy_to_device(tensor.raw(), host, tensor.nbytes());
  return tensor;
}

void CudaBackend::download(const Tensor& tensor, void* host) {
  require_device(tensor, "download", "tensor");
  BEAMLINE_CUDA_CHECK(cudaMemcpyAsync(host, tensor.raw(), tensor.nbytes(), cudaMemcpyDeviceToHost, stream_));
  BEAMLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (op_times_) op_times_->resolve();
}

namespace {

// The copy lands in a pinned buffer behind an event; wait() moves it to the caller's memory.
class CudaPendingDownload final : public PendingDownload {
 public:
  CudaPendingDownload(cuda::PinnedReadbackPool& pool, std::size_t bytes, void* host)
      : pool_(pool), bytes_(bytes), host_(host), pinned_(pool.acquire(bytes)) {
    const cudaError_t status = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    if (status != cudaSuccess) {
      pool_.release(pinned_, bytes_);
      cuda::check(status, "cudaEventCreateWithFlags");
    }
  }
  ~CudaPendingDownload() override {
    // The copy may still be writing the pinned buffer; it goes back to the pool only once it is done.
    if (!waited_) cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    pool_.release(pinned_, bytes_);
  }
  void enqueue(const void* device, cudaStream_t stream) {
    BEAMLINE_CUDA_CHECK(cudaMemcpyAsync(pinned_, device, bytes_, cudaMemcpyDeviceToHost, stream));
    BEAMLINE_CUDA_CHECK(cudaEventRecord(done_, stream));
  }
  void wait() override {
    if (waited_) return;
    BEAMLINE_CUDA_CHECK(cudaEventSynchronize(done_));
    std::memcpy(host_, pinned_, bytes_);
    waited_ = true;
  }

 private:
  cuda::PinnedReadbackPool& pool_;
  std::size_t bytes_;
  void* host_;
  void* pinned_;
  cudaEvent_t done_ = nullptr;
  bool waited_ = false;
};

}  // namespace

std::unique_ptr<PendingDownload> CudaBackend::download_later(const Tensor& tensor, void* host) {
  require_device(tensor, "download_later", "tensor");
  auto pending = std::make_unique<CudaPendingDownload>(readback_, tensor.nbytes(), host);
  pending->enqueue(tensor.raw(), stream_);
  return pending;
}

void CudaBackend::copy_to(Tensor& tensor, const void* host) {
  const auto timing = time_op("upload");
  require_device(tensor, "copy_to", "tensor");
  require_not_capturing("copy_to");
  staging_->copy_to_device(tensor.raw(), host, tensor.nbytes());
}

namespace {

struct CudaGraph final : OpGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~CudaGraph() override {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

}  // namespace

void CudaBackend::begin_capture() {
  require(!capturing_, "begin_capture: a graph is already being recorded");
  // Relaxed: the caching allocator may still cudaMalloc while the ops are recorded.
  BEAMLINE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  allocator_.begin_recording();
  capturing_ = true;
}

std::unique_ptr<OpGraph> CudaBackend::end_capture() {
  require(capturing_, "end_capture: no graph is being recorded");
  capturing_ = false;
  allocator_.end_recording();
  auto graph = std::make_unique<CudaGraph>();
  BEAMLINE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph->graph));
  BEAMLINE_CUDA_CHECK(cudaGraphInstantiate(&graph->exec, graph->graph, 0));
  return graph;
}

void CudaBackend::replay(const OpGraph& graph) {
  const auto* cuda_graph = dynamic_cast<const CudaGraph*>(&graph);
  require(cuda_graph != nullptr, "replay: the graph was not recorded by the cuda backend");
  const auto timing = time_op("graph replay (a whole decode step)");
  BEAMLINE_CUDA_CHECK(cudaGraphLaunch(cuda_graph->exec, stream_));
}

std::optional<Backend::MemoryInfo> CudaBackend::memory_info() {
  // The allocator's cached blocks count as used: they are this process's.
  std::size_t free = 0, total = 0;
  BEAMLINE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return MemoryInfo{static_cast<int64_t>(total), static_cast<int64_t>(total - free)};
}

void CudaBackend::synchronize() {
  BEAMLINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (op_times_) op_times_->resolve();
}

Tensor CudaBackend::load_weight(const TensorView& view) {
  require(view.data != nullptr, "load_weight: tensor {} has no data", view.name);
  Tensor probe(Device::Cuda, view.dtype, view.shape, nullptr, nullptr);
  require(probe.nbytes() <= view.nbytes, "load_weight: tensor {} {} needs {} bytes, the view has {}", view.name,
          shape_string(view.shape), probe.nbytes(), view.nbytes);
  std::shared_ptr<std::byte> memory = weights_.allocate(probe.nbytes());
  staging_->copy_to_device(memory.get(), view.data, probe.nbytes());
  ++weights_loaded_;
  if (weights_.bytes_used() >= weight_bytes_logged_ + kWeightLogInterval || weights_loaded_ == 1) {
    weight_bytes_logged_ = weights_.bytes_used();
    spdlog::info("cuda backend: {} weight tensors, {:.2f} GiB on the device", weights_loaded_,
                 static_cast<double>(weights_.bytes_used()) / (1ull << 30));
  }
  std::byte* data = memory.get();
  return Tensor(Device::Cuda, view.dtype, view.shape, data, std::move(memory));
}

Tensor CudaBackend::random_weight(DType dtype, std::vector<int64_t> shape, uint64_t key, float mean, float stddev) {
  if (dtype == DType::F8_E4M3) {  // FP8 codes for benchmarks (the CPU backend draws no FP8 weights)
    Tensor probe(Device::Cuda, dtype, shape, nullptr, nullptr);
    std::shared_ptr<std::byte> memory = weights_.allocate(probe.nbytes());
    check_launch(cuda::fp8::fill_random_e4m3(reinterpret_cast<uint8_t*>(memory.get()), probe.numel(), key, mean, stddev,
                                             stream_),
                 "random_weight");
    std::byte* data = memory.get();
    return Tensor(Device::Cuda, dtype, std::move(shape), data, std::move(memory));
  }
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
          "random_weight: dtype {} is not a float storage type (F32, BF16, F16)", dtype_name(dtype));
  Tensor probe(Device::Cuda, dtype, shape, nullptr, nullptr);
  std::shared_ptr<std::byte> memory = weights_.allocate(probe.nbytes());
  check_launch(cuda::fill_random(memory.get(), dtype, probe.numel(), key, mean, stddev, stream_), "random_weight");
  std::byte* data = memory.get();
  return Tensor(Device::Cuda, dtype, std::move(shape), data, std::move(memory));
}

namespace {

// FP8 experts (shapes checked by check_swiglu): the scale pointers and the tensor maps of every matrix for the FP8
// wgmma GEMMs.
void prepare_fp8_experts(Backend& backend, const MoeTensors& moe, const std::vector<int64_t>& pointers,
                         PackedExperts& packed) {
  const auto experts = static_cast<int64_t>(moe.experts.size());
  packed.dtype = DType::F8_E4M3;
  packed.hidden = moe.experts.front().gate.weight.dim(1);
  packed.intermediate = moe.experts.front().gate.weight.dim(0);
  require(cuda::fp8::moe_supported(static_cast<int32_t>(experts), packed.hidden, packed.intermediate),
          "prepare_moe: {} FP8 experts of H {} and I {} exceed the cuda kernels' limits ({} experts, widths multiples "
          "of 16)",
          experts, packed.hidden, packed.intermediate, cuda::kMaxMmaExperts);
  std::vector<int64_t> scales(static_cast<std::size_t>(3 * experts));
  std::vector<unsigned char> maps(3 * static_cast<std::size_t>(experts) * cuda::fp8::kTensorMapBytes);
  for (int64_t e = 0; e < experts; ++e) {
    const SwigluTensors& expert = moe.experts[static_cast<std::size_t>(e)];
    const LinearTensors* matrices[3] = {&expert.gate, &expert.up, &expert.down};
    for (int64_t m = 0; m < 3; ++m) {
      const auto i = static_cast<std::size_t>(m * experts + e);
      scales[i] = reinterpret_cast<int64_t>(matrices[m]->scale.raw());
      const bool down = m == 2;
      BEAMLINE_CUDA_CHECK(cuda::fp8::encode_weight_map(reinterpret_cast<const void*>(pointers[i]),
                                                       down ? packed.hidden : packed.intermediate,
                                                       down ? packed.intermediate : packed.hidden,
                                                       maps.data() + i * cuda::fp8::kTensorMapBytes));
    }
  }
  packed.scale_pointers = backend.upload(scales.data(), DType::I64, {3, experts});
  packed.tensor_maps =
      backend.upload(maps.data(), DType::U8, {3, experts, static_cast<int64_t>(cuda::fp8::kTensorMapBytes)});
}

}  // namespace

void CudaBackend::prepare_moe(MoeTensors& moe) {
  require(!moe.experts.empty(), "prepare_moe: no experts");
  const int64_t experts = static_cast<int64_t>(moe.experts.size());
  const int64_t hidden = logical_in(moe.experts.front().gate);
  std::vector<int64_t> pointers(static_cast<std::size_t>(3 * experts));
  for (int64_t e = 0; e < experts; ++e) {
    const SwigluTensors& expert = moe.experts[static_cast<std::size_t>(e)];
    check_swiglu(expert, hidden, "prepare_moe");
    require_shape(expert.gate.weight, moe.experts.front().gate.weight.shape(), "prepare_moe", "expert gate");
    require_dtype(expert.gate.weight, moe.experts.front().gate.weight.dtype(), "prepare_moe", "expert gate");
    pointers[static_cast<std::size_t>(e)] = reinterpret_cast<int64_t>(expert.gate.weight.raw());
    pointers[static_cast<std::size_t>(experts + e)] = reinterpret_cast<int64_t>(expert.up.weight.raw());
    pointers[static_cast<std::size_t>(2 * experts + e)] = reinterpret_cast<int64_t>(expert.down.weight.raw());
  }
  auto packed = std::make_shared<PackedExperts>();
  packed->pointers = upload(pointers.data(), DType::I64, {3, experts});
  if (const std::optional<cuda::micro::Format> format = micro_format(moe.experts.front().gate)) {
    packed->micro = format;
    packed->dtype = moe.experts.front().gate.weight.dtype();
    packed->hidden = hidden;
    packed->intermediate = moe.experts.front().gate.weight.dim(0);
    require(cuda::micro::moe_supported(*format, hidden, packed->intermediate),
            "prepare_moe: {} experts of H {} and I {} need widths that are multiples of {}", format_name(*format),
            hidden, packed->intermediate, cuda::micro::group_size(*format));
    std::vector<int64_t> scales(static_cast<std::size_t>(3 * experts)), scales_2(scales.size());
    bool aligned = true;
    for (int64_t e = 0; e < experts; ++e) {
      const SwigluTensors& expert = moe.experts[static_cast<std::size_t>(e)];
      const LinearTensors* matrices[3] = {&expert.gate, &expert.up, &expert.down};
      for (int64_t m = 0; m < 3; ++m) {
        const cuda::micro::Weight weight = micro_weight(*matrices[m]);
        scales[static_cast<std::size_t>(m * experts + e)] = reinterpret_cast<int64_t>(weight.scales);
        aligned = aligned && reinterpret_cast<uintptr_t>(weight.scales) % 4 == 0;
        scales_2[static_cast<std::size_t>(m * experts + e)] = reinterpret_cast<int64_t>(weight.scale_2);
      }
    }
    packed->scale_pointers = upload(scales.data(), DType::I64, {3, experts});
    packed->scales_aligned = aligned;
    if (*format == cuda::micro::Format::Nvfp4) packed->scale_2_pointers = upload(scales_2.data(), DType::I64, {3, experts});
    moe.packed = std::move(packed);
    return;
  }
  if (is_fp8_block(moe.experts.front().gate)) {
    prepare_fp8_experts(*this, moe, pointers, *packed);
    moe.packed = std::move(packed);
    return;
  }
  packed->dtype = moe.experts.front().gate.weight.dtype();
  packed->hidden = hidden;
  packed->intermediate = moe.experts.front().gate.weight.dim(0);
  if (cuda::moe_mma_supported(packed->dtype, static_cast<int32_t>(experts), hidden, packed->intermediate)) {
    std::vector<unsigned char> maps(3 * static_cast<std::size_t>(experts) * cuda::kTensorMapBytes);
    for (std::size_t i = 0; i < pointers.size(); ++i) {
      const bool down = i >= 2 * static_cast<std::size_t>(experts);
      const int64_t rows = down ? hidden : packed->intermediate, cols = down ? packed->intermediate : hidden;
      BEAMLINE_CUDA_CHECK(cuda::encode_expert_tensor_map(reinterpret_cast<const void*>(pointers[i]), rows, cols,
                                                         maps.data() + i * cuda::kTensorMapBytes));
    }
    packed->tensor_maps =
        upload(maps.data(), DType::U8, {3, experts, static_cast<int64_t>(cuda::kTensorMapBytes)});
  }
  moe.packed = std::move(packed);
}

// ---- ops ----

void CudaBackend::place_tokens(const Tensor& source, std::span<const int32_t> pairs, Tensor& tokens) {
  const auto timing = time_op("place_tokens");
  check_place_tokens_args(source, pairs, tokens);
  require_device(source, "place_tokens", "source");
  require_device(tokens, "place_tokens", "tokens");
  if (pairs.empty()) return;
  const Tensor device_pairs = upload(pairs.data(), DType::I32, {static_cast<int64_t>(pairs.size())});
  check_launch(cuda::place_tokens(source.data<const int32_t>(), device_pairs.data<const int32_t>(),
                                  static_cast<int64_t>(pairs.size() / 2), tokens.data<int32_t>(), stream_),
               "place_tokens");
}

void CudaBackend::embedding(const Tensor& table, const Tensor& tokens, Tensor& out) {
  const auto timing = time_op("embedding");
  require_float_weight(table, "embedding", "table");
  require_dtype(tokens, DType::I32, "embedding", "tokens");
  require_device(tokens, "embedding", "tokens");
  const int64_t rows = tokens.numel(), hidden = table.dim(1);
  require_shape(out, {rows, hidden}, "embedding", "out");
  require_dtype(out, DType::F32, "embedding", "out");
  check_launch(cuda::embedding(table.raw(), table.dtype(), table.dim(0), tokens.data<const int32_t>(), rows, hidden,
                               out.data<float>(), stream_),
               "embedding");
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const auto timing = time_op("rms_norm");
  require_device(x, "rms_norm", "x");
  require(x.rank() == 2, "rms_norm: x must be [T, H], got {}", describe(x));
  const int64_t rows = x.dim(0), hidden = x.dim(1);
  require_float_weight(weight, "rms_norm", "weight");
  require_shape(weight, {hidden}, "rms_norm", "weight");
  require_shape(out, x.shape(), "rms_norm", "out");
  check_launch(cuda::rms_norm(x.data<const float>(), weight.raw(), weight.dtype(), eps, rows, hidden, out.data<float>(),
                              stream_),
               "rms_norm");
}

void CudaBackend::add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale) {
  const auto timing = time_op("add_rms_norm");
  require_device(residual, "add_rms_norm", "residual");
  require(residual.rank() == 2, "add_rms_norm: residual must be [T, H], got {}", describe(residual));
  const int64_t rows = residual.dim(0), hidden = residual.dim(1);
  require_float_weight(weight, "add_rms_norm", "weight");
  require_shape(weight, {hidden}, "add_rms_norm", "weight");
  require_shape(y, residual.shape(), "add_rms_norm", "y");
  check_launch(cuda::add_rms_norm(residual.data<float>(), y.data<const float>(), weight.raw(), weight.dtype(), eps,
                                  scale, rows, hidden, stream_),
               "add_rms_norm");
}

void CudaBackend::add_rms_norm_then_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps,
                                         float scale, const Tensor& next_weight, Tensor& out) {
  const auto timing = time_op("add_rms_norm_then_norm");
  require_device(residual, "add_rms_norm_then_norm", "residual");
  require(residual.rank() == 2, "add_rms_norm_then_norm: residual must be [T, H], got {}", describe(residual));
  const int64_t rows = residual.dim(0), hidden = residual.dim(1);
  require_float_weight(weight, "add_rms_norm_then_norm", "weight");
  require_shape(weight, {hidden}, "add_rms_norm_then_norm", "weight");
  require_float_weight(next_weight, "add_rms_norm_then_norm", "next_weight");
  require_shape(next_weight, {hidden}, "add_rms_norm_then_norm", "next_weight");
  if (next_weight.dtype() != weight.dtype()) {  // the fused kernel reads both weights as one type
    Backend::add_rms_norm_then_norm(residual, y, weight, eps, scale, next_weight, out);
    return;
  }
  require_shape(y, residual.shape(), "add_rms_norm_then_norm", "y");
  require_shape(out, residual.shape(), "add_rms_norm_then_norm", "out");
  check_launch(cuda::add_rms_norm_then_norm(residual.data<float>(), y.data<const float>(), weight.raw(),
                                            next_weight.raw(), weight.dtype(), eps, scale, rows, hidden,
                                            out.data<float>(), stream_),
               "add_rms_norm_then_norm");
}

static_assert(cuda::kAllReduceMaxRanks == kMaxAllReduceRanks);

// The partials are on this device and complete (stream order): no handshake. A tensor-parallel run launches
// cuda::all_reduce_add_rms_norm itself, with its peers' IPC-mapped buffers and signals.
void CudaBackend::all_reduce_add_rms_norm(std::span<const Tensor> partials, Tensor& residual, const Tensor& weight,
                                          float eps, float scale, const Tensor& next_weight, Tensor& out) {
  constexpr const char* op = "all_reduce_add_rms_norm";
  const auto timing = time_op(op);
  const int64_t hidden = check_all_reduce_add_rms_norm_args(partials, residual, weight, next_weight, out);
  require_device(residual, op, "residual");
  require_float_weight(weight, op, "weight");
  require(hidden <= cuda::kAllReduceMaxHidden, "{}: rows of {} values exceed the {} the CUDA kernel holds in registers",
          op, hidden, cuda::kAllReduceMaxHidden);
  cuda::AllReducePeers peers;
  peers.ranks = static_cast<int32_t>(partials.size());
  for (std::size_t r = 0; r < partials.size(); ++r) {
    require_device(partials[r], op, fmt::format("partial of rank {}", r));
    peers.partial[r] = partials[r].data<const float>();
  }
  check_launch(cuda::all_reduce_add_rms_norm(peers, residual.data<float>(), weight.raw(),
                                             out.defined() ? next_weight.raw() : nullptr, weight.dtype(), eps, scale,
                                             residual.dim(0), hidden, out.defined() ? out.data<float>() : nullptr,
                                             stream_),
               op);
}

void CudaBackend::gemm_wt(const void* x, DType dtype, int64_t rows, int64_t in, const Tensor& weight, float* y) {
  const int64_t out = weight.dim(0);
  if (rows == 0 || out == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t type = cuda_type(dtype);
  // Row-major y = x Wᵀ is column-major yᵀ = W xᵀ: W [out, in] row-major is Wᵀ column-major, so transpose it.
  BEAMLINE_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, to_int(out, "out features"),
                                     to_int(rows, "rows"), to_int(in, "in features"), &alpha, weight.raw(), type,
                                     to_int(in, "in features"), x, type, to_int(in, "in features"), &beta, y,
                                     CUDA_R_32F, to_int(out, "out features"), CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
}

bool CudaBackend::project_streaming(const float* x, int64_t rows, std::span<const Tensor* const> weights,
                                    std::span<float* const> ys, float softcap, int64_t max_rows) {
  int64_t bytes = 0;
  for (const Tensor* weight : weights) bytes += weight->nbytes();
  if (bytes <= kSmallWeightBytes) max_rows = std::max(max_rows, kSmallStreamingMaxRows);
  if (rows > std::min(streaming_max_rows_, max_rows) || weights.empty() || weights.size() > cuda::kMaxProjectionWeights || !aligned16(x))
    return false;
  cuda::ProjectionBatch batch;
  batch.count = static_cast<int32_t>(weights.size());
  batch.dtype = weights.front()->dtype();
  batch.in = weights.front()->dim(1);
  batch.softcap = softcap;
  if (!cuda::projection_supported(batch.dtype, rows, batch.in)) return false;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const Tensor& weight = *weights[i];
    if (weight.dtype() != batch.dtype || weight.dim(1) != batch.in || !aligned16(weight.raw())) return false;
    batch.weight[i] = weight.raw();
    batch.y[i] = ys[i];
    batch.out[i] = weight.dim(0);
  }
  check_launch(cuda::project_rows(x, rows, batch, stream_), "linear");
  return true;
}

void CudaBackend::project(const float* x, int64_t rows, const Tensor& weight, float* y) {
  const Tensor* const weights[] = {&weight};
  float* const outputs[] = {y};
  if (project_streaming(x, rows, weights, outputs, 0.0f, kStreamingSingleMaxRows)) return;
  project_gemms(x, rows, weights, outputs);
}

void CudaBackend::project_gemms(const float* x, int64_t rows, std::span<const Tensor* const> weights,
                                std::span<float* const> ys) {
  const int64_t in = weights.front()->dim(1);
  const DType dtype = weights.front()->dtype();
  if (dtype == DType::F32) {
    for (std::size_t i = 0; i < weights.size(); ++i) gemm_wt(x, dtype, rows, in, *weights[i], ys[i]);
    return;
  }
  // Bf16: one rounding of x. Split: one GEMM over [hi; lo; lo2] per weight reads the weight once, as a plain BF16 GEMM
  // would (decode is bound by those bytes), and add_terms sums the three products.
  const bool rounded = operand_precision() == cuda::OperandPrecision::Bf16;
  const int64_t terms = rounded ? 1 : cuda::kSplitTerms;
  Tensor split = scratch(dtype, {terms * rows, in});
  check_launch(cuda::split_f32(x, rows * in, split.raw(), static_cast<int>(terms), dtype, stream_), "linear");
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (rounded) {
      gemm_wt(split.raw(), dtype, rows, in, *weights[i], ys[i]);
      continue;
    }
    const int64_t out = weights[i]->dim(0);
    Tensor partials = scratch(DType::F32, {terms * rows, out});
    gemm_wt(split.raw(), dtype, terms * rows, in, *weights[i], partials.data<float>());
    check_launch(cuda::add_terms(partials.data<const float>(), rows * out, ys[i], stream_), "linear");
  }
}

void CudaBackend::project_fp8(const float* x, int64_t rows, std::span<const LinearTensors* const> weights,
                              std::span<float* const> ys, float softcap) {
  if (rows == 0 || weights.empty()) return;
  const int64_t in = weights.front()->weight.dim(1);
  if (rows <= std::min(streaming_max_rows_, kFp8StreamingMaxRows) && aligned16(x) &&
      cuda::fp8::stream_supported(rows, in)) {
    // W8A16: every weight byte read once, F32 activations; kMaxStreamWeights weights per launch.
    for (std::size_t first = 0; first < weights.size(); first += cuda::fp8::kMaxStreamWeights) {
      cuda::fp8::StreamBatch batch;
      batch.in = in;
      batch.softcap = softcap;
      for (std::size_t i = first; i < std::min(weights.size(), first + cuda::fp8::kMaxStreamWeights); ++i) {
        batch.weight[batch.count] = weights[i]->weight.data<const uint8_t>();
        batch.scale[batch.count] = weights[i]->scale.data<const float>();
        batch.y[batch.count] = ys[i];
        batch.out[batch.count] = weights[i]->weight.dim(0);
        ++batch.count;
      }
      check_launch(cuda::fp8::stream_rows(x, rows, batch, stream_), "linear (fp8 streaming)");
    }
    return;
  }
  if (fp8_cublas_takes(rows, weights, ys, softcap)) {
    fp8_cublas(x, rows, weights, ys);
    return;
  }
  // W8A8: the rows quantized once per token and 128 channels, then one FP8 wgmma GEMM per weight.
  Tensor xq = scratch(DType::U8, {rows, in}), xs = scratch(DType::F32, {rows, cuda::fp8::blocks_of(in)});
  check_launch(cuda::fp8::quantize_rows(x, rows, in, xq.data<uint8_t>(), xs.data<float>(), stream_),
               "linear (fp8 quantize)");
  for (std::size_t i = 0; i < weights.size(); ++i)
    check_launch(cuda::fp8::linear(xq.data<const uint8_t>(), xs.data<const float>(), rows, in, weights[i]->weight.raw(),
                                   weights[i]->scale.data<const float>(), weights[i]->weight.dim(0), softcap, ys[i],
                                   stream_),
                 "linear (fp8 wgmma)");
}

bool CudaBackend::fp8_cublas_takes(int64_t rows, std::span<const LinearTensors* const> weights,
                                   std::span<float* const> ys, float softcap) {
  if (softcap > 0.0f || rows < fp8_cublas_min_rows_ || weights.empty()) return false;
  const int64_t in = weights.front()->weight.dim(1);
  for (std::size_t i = 0; i < weights.size(); ++i)
    if (!aligned16(ys[i]) || !fp8_gemm_->supports(rows, in, weights[i]->weight.dim(0))) return false;
  return true;
}

bool CudaBackend::fp8_cublas_path(int64_t rows, int64_t in, int64_t out) {
  return rows > std::min(streaming_max_rows_, kFp8StreamingMaxRows) && rows >= fp8_cublas_min_rows_ &&
         fp8_gemm_->supports(rows, in, out);
}

// W8A8 on cuBLASLt: the rows quantized once per token and 128 channels (scales token-major, as cuBLASLt reads
// them), then one block-scaled FP8 matmul per weight.
void CudaBackend::fp8_cublas(const float* x, int64_t rows, std::span<const LinearTensors* const> weights,
                             std::span<float* const> ys) {
  const int64_t in = weights.front()->weight.dim(1);
  Tensor xq = scratch(DType::U8, {rows, in}), xs = scratch(DType::F32, {cuda::fp8::blocks_of(in), rows});
  check_launch(cuda::fp8::quantize_rows_token_major(x, rows, in, xq.data<uint8_t>(), xs.data<float>(), stream_),
               "linear (fp8 quantize)");
  for (std::size_t i = 0; i < weights.size(); ++i)
    BEAMLINE_CUBLAS_CHECK(fp8_gemm_->linear(xq.data<const uint8_t>(), xs.data<const float>(), rows, in,
                                            weights[i]->weight.raw(), weights[i]->scale.data<const float>(),
                                            weights[i]->weight.dim(0), ys[i], stream_));
}

void CudaBackend::project_micro(const float* x, int64_t rows, std::span<const LinearTensors* const> weights,
                                std::span<float* const> ys, float softcap) {
  if (rows == 0 || weights.empty()) return;
  const cuda::micro::Format format = *micro_format(*weights.front());
  const int64_t in = logical_in(*weights.front());
  if (rows <= std::min(streaming_max_rows_, kMicroStreamingMaxRows) && aligned16(x)) {
    for (std::size_t first = 0; first < weights.size(); first += cuda::micro::kMaxStreamWeights) {
      cuda::micro::StreamBatch batch;
      batch.format = format;
      batch.in = in;
      batch.softcap = softcap;
      for (std::size_t i = first; i < std::min(weights.size(), first + cuda::micro::kMaxStreamWeights); ++i) {
        batch.weight[batch.count] = micro_weight(*weights[i]);
        batch.y[batch.count] = ys[i];
        batch.out[batch.count] = weights[i]->weight.dim(0);
        ++batch.count;
      }
      for (int64_t r = 0; r < rows; ++r) {
        cuda::micro::StreamBatch row = batch;
        for (int32_t s = 0; s < row.count; ++s) row.y[s] += r * row.out[s];
        check_launch(cuda::micro::stream_row(x + r * in, row, stream_), "linear (mxfp8/nvfp4 streaming)");
      }
    }
    return;
  }
  // More rows: each weight decoded exactly into BF16 scratch, the BF16 GEMM, then NVFP4's scale_2 and the soft cap.
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const int64_t out = weights[i]->weight.dim(0);
    const cuda::micro::Weight weight = micro_weight(*weights[i]);
    Tensor decoded = scratch(DType::BF16, {out, in});
    check_launch(cuda::micro::decode_bf16(format, weight, out, in, reinterpret_cast<__nv_bfloat16*>(decoded.raw()),
                                          stream_),
                 "linear (mxfp8/nvfp4 decode)");
    project(x, rows, decoded, ys[i]);
    check_launch(cuda::micro::scale_outputs(ys[i], rows * out, weight.scale_2, softcap, stream_),
                 "linear (mxfp8/nvfp4 scale)");
  }
}

void CudaBackend::quantize_fp8_rows(const Tensor& x, Tensor& codes, Tensor& scales) {
  require_device(x, "quantize_fp8_rows", "x");
  require(x.rank() == 2, "quantize_fp8_rows: x must be [rows, cols], got {}", describe(x));
  const int64_t rows = x.dim(0), cols = x.dim(1);
  require_dtype(x, DType::F32, "quantize_fp8_rows", "x");
  require(cuda::fp8::quantize_supported(cols), "quantize_fp8_rows: {} columns are not a multiple of 16", cols);
  require_shape(codes, {rows, cols}, "quantize_fp8_rows", "codes");
  require_shape(scales, {rows, cuda::fp8::blocks_of(cols)}, "quantize_fp8_rows", "scales");
  check_launch(cuda::fp8::quantize_rows(x.data<const float>(), rows, cols, codes.data<uint8_t>(), scales.data<float>(),
                                        stream_),
               "quantize_fp8_rows");
}

void CudaBackend::project_invariant(const float* x, int64_t rows, const Tensor& weight, float* y, float softcap) {
  check_launch(cuda::project_row_invariant(x, rows, weight.raw(), weight.dtype(), weight.dim(1), weight.dim(0), softcap,
                                           y, stream_),
               "linear (batch-invariant)");
}

void CudaBackend::linear(const Tensor& x, const LinearTensors& weight, Tensor& y) {
  const auto timing = time_op("linear");
  check_linear(x, weight, y, "linear");
  if (batch_invariant_) {
    require_row_invariant(weight, "linear");
    project_invariant(x.data<const float>(), x.dim(0), weight.weight, y.data<float>(), 0.0f);
    return;
  }
  if (micro_format(weight)) {
    const LinearTensors* const weights[] = {&weight};
    float* const outputs[] = {y.data<float>()};
    project_micro(x.data<const float>(), x.dim(0), weights, outputs, 0.0f);
    return;
  }
  if (is_fp8_block(weight)) {
    const LinearTensors* const weights[] = {&weight};
    float* const outputs[] = {y.data<float>()};
    project_fp8(x.data<const float>(), x.dim(0), weights, outputs, 0.0f);
    return;
  }
  project(x.data<const float>(), x.dim(0), weight.weight, y.data<float>());
}

void CudaBackend::lora(const Tensor& x, const LoraTensors& lora, const Tensor& indices, Tensor& y) {
  const auto timing = time_op("lora");
  const int64_t adapters = check_lora_args(x, lora, indices, y);
  const int64_t rows = x.dim(0), rank = lora.a.dim(1);
  Tensor shrunk = scratch(DType::F32, {rows, rank});
  check_launch(cuda::lora_gathered(x.data<const float>(), lora.a.data<const float>(), lora.b.data<const float>(),
                                   indices.data<const int32_t>(), rows, adapters, rank, x.dim(1), y.dim(1),
                                   shrunk.data<float>(), y.data<float>(), stream_),
               "lora");
}

void CudaBackend::moe_lora(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                           const MoeTensors& moe, const SwigluLora& lora, Tensor& out) {
  const auto timing = time_op("moe_lora");
  require(!batch_invariant_, "moe_lora: --batch-invariant on cuda has no row-invariant MoE LoRA kernels yet (serve the "
          "adapters on the cpu backend, or leave the flag off)");
  const auto experts = static_cast<int32_t>(check_moe_lora_args(h, moe, lora));
  require(moe.packed != nullptr, "moe_lora: the experts were not prepared (Backend::prepare_moe) on the cuda backend");
  const auto& packed = *static_cast<const PackedExperts*>(moe.packed.get());
  require(!packed.micro && (packed.dtype == DType::BF16 || packed.dtype == DType::F16),
          "moe_lora: the cuda backend applies LoRA to BF16 or F16 experts (moe's kernels); these are {} "
          "(docs/lora.md)",
          packed.micro ? format_name(*packed.micro) : std::string(dtype_name(packed.dtype)));
  require(experts <= cuda::kMaxMmaExperts, "moe_lora: {} experts, the cuda kernels take at most {}", experts,
          cuda::kMaxMmaExperts);
  require_device(h, "moe_lora", "h");
  const int64_t rows = h.dim(0), hidden = h.dim(1), top_k = expert_ids.dim(1);
  require(hidden == packed.hidden, "moe_lora: h has {} features, the experts take {}", hidden, packed.hidden);
  require_shape(expert_ids, {rows, top_k}, "moe_lora", "expert_ids");
  require_shape(expert_weights, {rows, top_k}, "moe_lora", "expert_weights");
  require_dtype(expert_ids, DType::I32, "moe_lora", "expert_ids");
  require_dtype(expert_weights, DType::F32, "moe_lora", "expert_weights");
  require_shape(out, h.shape(), "moe_lora", "out");
  if (rows == 0) return;
  const int64_t assignments = rows * top_k, intermediate = packed.intermediate;
  cuda::MoeLoraArgs args;
  args.h = h.data<const float>();
  args.ids = expert_ids.data<const int32_t>();
  args.row_adapters = lora.row_adapters.data<const int32_t>();
  args.rows = rows;
  args.hidden = hidden;
  args.intermediate = intermediate;
  args.top_k = static_cast<int32_t>(top_k);
  args.experts = experts;
  const auto view = [](const LoraTable& table) {
    return table.defined() ? cuda::LoraTableView{table.entries.data<const int64_t>(), table.max_rank}
                           : cuda::LoraTableView{};
  };
  args.gate = view(lora.gate);
  args.up = view(lora.up);
  args.down = view(lora.down);
  // One token: its few slots need no grouping by expert (one launch less).
  cuda::MoeLoraWorkspace workspace;
  Tensor grouped, tiles;
  if (rows > 1) {
    workspace.max_tiles = cuda::moe_lora_max_tiles(assignments, experts);
    grouped = scratch(DType::I32, {assignments});
    tiles = scratch(DType::I32, {workspace.max_tiles, 4});
    workspace.grouped = grouped.data<int32_t>();
    workspace.tiles = tiles.data<int32_t>();
  }
  const int64_t ranks = args.gate.max_rank + args.up.max_rank + args.down.max_rank;
  Tensor shrunk = scratch(DType::F32, {assignments * ranks + 1});
  const bool gate_up = args.gate.entries != nullptr || args.up.entries != nullptr;
  Tensor deltas_buffer = scratch(DType::F32, {assignments * ((gate_up ? 2 * intermediate : 0) +
                                                             (args.down.entries != nullptr ? hidden : 0)) + 1});
  workspace.shrunk_gate = shrunk.data<float>();
  workspace.shrunk_up = workspace.shrunk_gate + assignments * args.gate.max_rank;
  workspace.shrunk_down = workspace.shrunk_up + assignments * args.up.max_rank;
  workspace.gate_up = deltas_buffer.data<float>();
  workspace.down = workspace.gate_up + (gate_up ? assignments * 2 * intermediate : 0);
  cuda::ExpertDeltas deltas;
  check_launch(cuda::moe_lora_deltas(args, workspace, deltas, stream_), "moe_lora");
  moe_experts(h, expert_ids, expert_weights, expert_pointers(packed), &deltas, out);
}

void CudaBackend::linear_many(const Tensor& x, std::span<const LinearTensors* const> weights,
                              std::span<Tensor* const> ys) {
  const auto timing = time_op("linear_many");
  require(weights.size() == ys.size(), "linear_many: {} weights for {} outputs", weights.size(), ys.size());
  std::vector<const Tensor*> matrices;
  std::vector<float*> outputs;
  std::size_t fp8 = 0, micro = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    check_linear(x, *weights[i], *ys[i], "linear_many");
    matrices.push_back(&weights[i]->weight);
    outputs.push_back(ys[i]->data<float>());
    fp8 += is_fp8_block(*weights[i]) ? 1 : 0;
    micro += micro_format(*weights[i]) ? 1 : 0;
    if (batch_invariant_) require_row_invariant(*weights[i], "linear_many");
  }
  if (batch_invariant_) {
    for (std::size_t i = 0; i < weights.size(); ++i)
      project_invariant(x.data<const float>(), x.dim(0), *matrices[i], outputs[i], 0.0f);
    return;
  }
  if (micro > 0) {
    const std::optional<cuda::micro::Format> format = micro_format(*weights.front());
    for (const LinearTensors* weight : weights)
      require(micro_format(*weight) == format, "linear_many: {} and {} in one call", describe(weights.front()->weight),
              describe(weight->weight));
    project_micro(x.data<const float>(), x.dim(0), weights, outputs, 0.0f);
    return;
  }
  if (fp8 > 0) {
    require(fp8 == weights.size(), "linear_many: FP8 and unquantized weights in one call");
    project_fp8(x.data<const float>(), x.dim(0), weights, outputs, 0.0f);
    return;
  }
  if (project_streaming(x.data<const float>(), x.dim(0), matrices, outputs, 0.0f, kStreamingMaxRows)) return;
  const bool one_dtype = std::all_of(matrices.begin(), matrices.end(),
                                     [&](const Tensor* matrix) { return matrix->dtype() == matrices.front()->dtype(); });
  if (one_dtype) {  // x made into operands once for all of them
    project_gemms(x.data<const float>(), x.dim(0), matrices, outputs);
    return;
  }
  for (std::size_t i = 0; i < weights.size(); ++i) project(x.data<const float>(), x.dim(0), *matrices[i], outputs[i]);
}

void CudaBackend::rope(Tensor& x, const Tensor& positions, int32_t num_heads, int32_t head_dim, float theta) {
  const auto timing = time_op("rope");
  check_rope(x, positions, num_heads, head_dim, "rope", "x");
  check_launch(cuda::rope(x.data<float>(), num_heads, nullptr, 0, positions.data<const int32_t>(), x.dim(0), head_dim,
                          theta, stream_),
               "rope");
}

void CudaBackend::rope_qk(Tensor& q, Tensor& k, const Tensor& positions, int32_t num_heads, int32_t num_kv_heads,
                          int32_t head_dim, float theta) {
  const auto timing = time_op("rope_qk");
  check_rope(q, positions, num_heads, head_dim, "rope_qk", "q");
  check_rope(k, positions, num_kv_heads, head_dim, "rope_qk", "k");
  check_launch(cuda::rope(q.data<float>(), num_heads, k.data<float>(), num_kv_heads, positions.data<const int32_t>(),
                          q.dim(0), head_dim, theta, stream_),
               "rope_qk");
}

void CudaBackend::check_rope(const Tensor& x, const Tensor& positions, int32_t num_heads, int32_t head_dim,
                             const char* op, const char* what) const {
  require_device(x, op, what);
  require(x.rank() == 2, "{}: {} must be [T, heads * head_dim], got {}", op, what, describe(x));
  const int64_t rows = x.dim(0);
  require(head_dim > 0 && head_dim % 2 == 0, "{}: head_dim {} is not even and positive", op, head_dim);
  require_shape(x, {rows, int64_t{num_heads} * head_dim}, op, what);
  require_shape(positions, {rows}, op, "positions");
  require_device(positions, op, "positions");
}

void CudaBackend::ssmax_scale(Tensor& q, const Tensor& positions, float base, float exponent) {
  const auto timing = time_op("ssmax_scale");
  require_device(q, "ssmax_scale", "q");
  const int64_t rows = q.dim(0), width = q.numel() / std::max<int64_t>(1, rows);
  require_shape(positions, {rows}, "ssmax_scale", "positions");
  require_device(positions, "ssmax_scale", "positions");
  check_launch(cuda::ssmax_scale(q.data<float>(), positions.data<const int32_t>(), rows, width, base, exponent, stream_),
               "ssmax_scale");
}

void CudaBackend::amax_scale(const Tensor& x, float divisor, Tensor& out) {
  const auto timing = time_op("amax_scale");
  check_amax_scale_args(x, divisor, out);
  require_device(x, "amax_scale", "x");
  require_device(out, "amax_scale", "out");
  check_launch(cuda::amax_scale(x.data<const float>(), x.numel(), divisor, out.data<float>(), stream_), "amax_scale");
}

void CudaBackend::write_kv(const Tensor& k, const Tensor& v, PagedKvPool& pool, int32_t slot, const Tensor& block_table,
                           const AttentionBatch& batch) {
  const auto timing = time_op("write_kv");
  check_pool(pool, slot, "write_kv");
  const int64_t rows = batch.num_rows(), width = int64_t{pool.num_kv_heads()} * pool.head_dim();
  require_shape(k, {rows, width}, "write_kv", "k");
  require_shape(v, {rows, width}, "write_kv", "v");
  require_device(k, "write_kv", "k");
  require_device(v, "write_kv", "v");
  check_launch(cuda::write_kv(k.data<const float>(), v.data<const float>(), pool_geometry(pool), slot,
                              batch_geometry(batch, block_table, "write_kv"), stream_),
               "write_kv");
}

void CudaBackend::paged_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                                  const AttentionBatch& batch, const AttentionParams& params, Tensor& out) {
  const auto timing = time_op("paged_attention");
  check_pool(pool, params.slot, "paged_attention");
  check_attention_args(q, pool, block_table, batch, params, out);
  const int32_t heads = params.num_heads, kv_heads = params.num_kv_heads, dim = params.head_dim;
  require(dim <= cuda::kMaxAttentionHeadDim && heads / kv_heads <= cuda::kMaxAttentionGroup,
          "paged_attention: head_dim {} / {} query heads per kv head exceed the cuda kernel's {} / {}", dim,
          heads / kv_heads, cuda::kMaxAttentionHeadDim, cuda::kMaxAttentionGroup);
  require_device(q, "paged_attention", "q");
  require_device(out, "paged_attention", "out");
  // The host copies were checked once, when the step's batch was made (Backend::make_attention_batch).
  const cuda::PoolGeometry geometry = pool_geometry(pool);
  const bool aligned = reinterpret_cast<uintptr_t>(q.raw()) % 16 == 0 && reinterpret_cast<uintptr_t>(out.raw()) % 16 == 0;
  // The generic kernel (batch-invariant mode's) reads E4M3 codes with the scale 1.0 only.
  require(!batch_invariant_ || geometry.scales == nullptr,
          "paged_attention: --batch-invariant on cuda takes an FP8 KV cache only without KV scales (scale 1.0)");
  const cuda::AttentionPlan plan = attention_plan(batch, pool, params, aligned);
  Tensor work, partials, shadow_kv, shadow_table, scaled_q;
  if (!plan.work.empty()) work = attention_work(plan.work);
  if (plan.scratch_floats > 0) partials = scratch(DType::F32, {plan.scratch_floats});
  cuda::ShadowBuffers shadow;
  if (plan.shadow_blocks > 0) {  // an FP8 pool's prefill tiles read a BF16 shadow of their keys (attention.h)
    shadow_kv = scratch(DType::BF16, {2, plan.shadow_blocks, pool.block_size(), kv_heads, dim});
    shadow_table = scratch(DType::I32, {batch.num_sequences(), block_table.dim(1)});
    shadow = {shadow_kv.raw(), static_cast<std::byte*>(shadow_kv.raw()) + shadow_kv.nbytes() / 2,
              shadow_table.data<int32_t>()};
    if (geometry.scales != nullptr) {
      scaled_q = scratch(DType::F32, {q.dim(0), q.dim(1)});
      shadow.scaled_q = scaled_q.data<float>();
    }
  }
  check_launch(cuda::paged_attention(q.data<const float>(), geometry, params.slot,
                                     batch_geometry(batch, block_table, "paged_attention"), plan,
                                     plan.work.empty() ? nullptr : work.data<const int32_t>(),
                                     plan.scratch_floats > 0 ? partials.data<float>() : nullptr, shadow, heads,
                                     params.scale, params.sliding_window, out.data<float>(), stream_),
               "paged_attention");
}

void CudaBackend::block_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                                  const AttentionBatch& blocks, const AttentionParams& params, Tensor& out) {
  const auto timing = time_op("block_attention");
  check_pool(pool, params.slot, "block_attention");
  const int32_t block = check_block_attention_args(q, pool, block_table, blocks, params, out);
  require(cuda::block_attention_supported(params.head_dim),
          "block_attention: head_dim {} is not a multiple of 4 up to the cuda kernel's {}", params.head_dim,
          cuda::kMaxAttentionHeadDim);
  require_device(q, "block_attention", "q");
  require_device(out, "block_attention", "out");
  check_launch(cuda::block_attention(q.data<const float>(), pool_geometry(pool), params.slot,
                                     batch_geometry(blocks, block_table, "block_attention"), block, params.num_heads,
                                     params.scale, params.sliding_window, out.data<float>(), stream_),
               "block_attention");
}

cuda::AttentionPlan CudaBackend::attention_plan(const AttentionBatch& batch, const PagedKvPool& pool,
                                               const AttentionParams& params, bool aligned) const {
  // Batch-invariant: every row, prefill or decode, on the one-block-per-(row, kv head) kernel, its keys in tiles of 32
  // in order (no split-KV count chosen by the batch, no prefill tiles whose rows share a block).
  if (batch_invariant_) {
    cuda::AttentionPlan plan;
    plan.generic = true;
    return plan;
  }
  cuda::AttentionHostBatch host;
  host.query_start = batch.host_query_start.data();
  host.positions = batch.host_positions.data();
  host.seq_lens = batch.host_seq_lens.data();
  host.sequences = batch.num_sequences();
  host.rows = batch.num_rows();
  return cuda::plan_attention(host, pool_geometry(pool), params.num_heads, params.sliding_window, aligned,
                              operand_precision());
}

const Tensor& CudaBackend::attention_work(const std::vector<int32_t>& work) {
  auto found = attention_work_.find(work);
  if (found == attention_work_.end()) {
    require(!capturing_, "paged_attention: a work list of {} entries that no op-by-op run uploaded before this "
            "recording", work.size());
    // The lists of op-by-op steps are many and short-lived (each step's prefill tiles): dropped in bulk.
    if (attention_work_.size() >= 1024) std::erase_if(attention_work_, [](const auto& entry) {
      return !entry.second.recorded;
    });
    found = attention_work_.emplace(work, AttentionWork{upload_i32(work, {static_cast<int64_t>(work.size())})}).first;
  }
  if (capturing_) found->second.recorded = true;
  return found->second.device;
}

std::optional<std::string> CudaBackend::attention_signature(const AttentionBatch& batch, const PagedKvPool& pool,
                                                            const AttentionParams& params) const {
  // Activations are 256-byte aligned by the allocator, so the graph's q and out are aligned too.
  cuda::AttentionPlan plan = attention_plan(batch, pool, params, true);
  // A work list (the listed decode rows, then the prefill tiles as (sequence, first row, rows)) is recorded with the
  // graph, so it is part of the signature. The tiles' order (longest first) only balances the waves: any order of
  // the same tiles computes the same, so they are compared as a set and steps whose lengths differ share a graph.
  const auto tiles = plan.work.begin() + (plan.decode_rows_listed ? plan.decode_rows : 0);
  std::vector<std::array<int32_t, 3>> sorted;
  for (auto tile = tiles; tile != tiles + 3 * plan.prefill_tiles; tile += 3) sorted.push_back({tile[0], tile[1], tile[2]});
  std::sort(sorted.begin(), sorted.end());
  std::string listed;
  for (auto row = plan.work.begin(); row != tiles; ++row) listed += fmt::format("{},", *row);
  std::string tile_set;
  for (const auto& [sequence, first_row, rows] : sorted) tile_set += fmt::format("{}/{}/{},", sequence, first_row, rows);
  // An FP8 pool's shadow (after the tiles) sizes the step's scratch and numbers its blocks: part of the graph too.
  std::string shadow;
  for (auto part = tiles + 3 * plan.prefill_tiles; part != plan.work.end(); ++part) shadow += fmt::format("{},", *part);
  return fmt::format("{}:{}:{}:{}:{}:[{}]:[{}]:[{}]", plan.generic, plan.decode_rows, plan.splits, plan.prefill_tiles,
                     plan.scratch_floats, listed, tile_set, shadow);
}

void CudaBackend::route(const Tensor& h, const Tensor& router, const Tensor& bias, const RouterParams& params,
                        Tensor& expert_ids, Tensor& expert_weights) {
  const auto timing = time_op("route");
  require_device(h, "route", "h");
  const int64_t rows = h.dim(0), hidden = h.dim(1), experts = router.dim(0);
  require_device(router, "route", "router");
  require_device(bias, "route", "bias");
  check_route_args(h, router, bias, params, expert_ids, expert_weights);
  require(experts <= cuda::kMaxRouterExperts, "route: {} experts exceed the cuda router's {}", experts,
          cuda::kMaxRouterExperts);
  Tensor logits = scratch(DType::F32, {rows, experts});
  const bool gemv = cuda::router_gemv_supported(h.data<const float>(), router.data<const float>(), hidden);
  require(gemv || !batch_invariant_,
          "route: --batch-invariant on cuda needs the router GEMV (hidden {} a multiple of 4 up to 16384, 16-byte "
          "aligned h and router)",
          hidden);
  const cuda::RouterChoice choice = router_choice(params);
  if (gemv && rows <= cuda::kRouterGemvMaxRows) {  // decode: the logits and the top-k in one launch
    check_launch(cuda::route_fused(h.data<const float>(), router.data<const float>(), bias.data<const float>(), rows,
                                   hidden, static_cast<int32_t>(experts), choice, logits.data<float>(),
                                   reinterpret_cast<uint32_t*>(route_arrivals_.data<int32_t>()),
                                   expert_ids.data<int32_t>(), expert_weights.data<float>(), stream_),
                 "route");
    return;
  }
  if (gemv && batch_invariant_)
    check_launch(cuda::router_gemv(h.data<const float>(), router.data<const float>(), rows, hidden, experts,
                                   logits.data<float>(), stream_),
                 "route");
  else
    gemm_wt(h.raw(), DType::F32, rows, hidden, router, logits.data<float>());
  check_launch(cuda::route_topk(logits.data<const float>(), bias.data<const float>(), rows,
                                static_cast<int32_t>(experts), choice, expert_ids.data<int32_t>(),
                                expert_weights.data<float>(), stream_),
               "route");
}

void CudaBackend::add_rms_norm_then_route(Tensor& residual, const Tensor& y, const Tensor& weight, float eps,
                                          float scale, const Tensor& next_weight, Tensor& out, const Tensor& router,
                                          const Tensor& bias, const RouterParams& params, Tensor& expert_ids,
                                          Tensor& expert_weights) {
  constexpr const char* op = "add_rms_norm_then_route";
  require_device(residual, op, "residual");
  require(residual.rank() == 2, "{}: residual must be [T, H], got {}", op, describe(residual));
  const int64_t rows = residual.dim(0), hidden = residual.dim(1), experts = router.dim(0);
  require_shape(y, residual.shape(), op, "y");
  require_shape(out, residual.shape(), op, "out");
  require_float_weight(weight, op, "weight");
  require_shape(weight, {hidden}, op, "weight");
  require_float_weight(next_weight, op, "next_weight");
  require_shape(next_weight, {hidden}, op, "next_weight");
  require_device(router, op, "router");
  require_device(bias, op, "bias");
  check_route_args(out, router, bias, params, expert_ids, expert_weights);
  const cuda::RouterChoice choice = router_choice(params);
  // One row, outside --batch-invariant (the folded norms sum a row in another order than add_rms_norm_then_norm's
  // kernel, so a row would differ with the batch it is in).
  const bool fold = rows == 1 && !batch_invariant_ && next_weight.dtype() == weight.dtype() &&
                    experts <= cuda::kMaxRouterExperts &&
                    cuda::add_rms_norm_then_route_supported(residual.data<const float>(), y.data<const float>(),
                                                            out.data<const float>(), router.data<const float>(),
                                                            weight.dtype(), hidden, static_cast<int32_t>(experts),
                                                            choice);
  if (!fold) {
    Backend::add_rms_norm_then_route(residual, y, weight, eps, scale, next_weight, out, router, bias, params,
                                     expert_ids, expert_weights);
    return;
  }
  const auto timing = time_op(op);
  Tensor logits = scratch(DType::F32, {rows, experts});
  check_launch(cuda::add_rms_norm_then_route(residual.data<float>(), y.data<const float>(), weight.raw(),
                                             next_weight.raw(), weight.dtype(), eps, scale, hidden, out.data<float>(),
                                             router.data<const float>(), bias.data<const float>(),
                                             static_cast<int32_t>(experts), choice, logits.data<float>(),
                                             reinterpret_cast<uint32_t*>(route_arrivals_.data<int32_t>()),
                                             expert_ids.data<int32_t>(), expert_weights.data<float>(), stream_),
               op);
}

void CudaBackend::moe(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
                      Tensor& out) {
  const auto timing = time_op("moe");
  require(moe.packed != nullptr, "moe: the experts were not prepared (Backend::prepare_moe) on the cuda backend");
  const auto& packed = *static_cast<const PackedExperts*>(moe.packed.get());
  require_device(h, "moe", "h");
  const int64_t rows = h.dim(0), hidden = h.dim(1), top_k = expert_ids.dim(1);
  const auto experts = static_cast<int32_t>(moe.experts.size());
  require(hidden == packed.hidden, "moe: h has {} features, the experts take {}", hidden, packed.hidden);
  require_shape(expert_ids, {rows, top_k}, "moe", "expert_ids");
  require_shape(expert_weights, {rows, top_k}, "moe", "expert_weights");
  require_dtype(expert_ids, DType::I32, "moe", "expert_ids");
  require_dtype(expert_weights, DType::F32, "moe", "expert_weights");
  require_shape(out, h.shape(), "moe", "out");
  if (rows == 0) return;
  require(!batch_invariant_ || (!packed.micro && (packed.dtype == DType::BF16 || packed.dtype == DType::F16)),
          "moe: --batch-invariant on cuda takes BF16 or F16 experts, not {} (no row-invariant expert kernels for it "
          "yet)",
          packed.micro ? std::string_view("MXFP8/NVFP4") : dtype_name(packed.dtype));
  if (packed.micro) {
    moe_micro(h, expert_ids, expert_weights, packed, experts, out);
    return;
  }
  if (packed.dtype == DType::F8_E4M3) {
    moe_fp8(h, expert_ids, expert_weights, packed, experts, out);
    return;
  }

  const cuda::ExpertPointers pointers = expert_pointers(packed);
  if (batch_invariant_) {
    moe_invariant(h, expert_ids, expert_weights, pointers, out);
    return;
  }
  moe_experts(h, expert_ids, expert_weights, pointers, nullptr, out);
}

// The expert kernels of moe (BF16 or F16 experts), chosen by the row count alone; `deltas` (moe_lora) enter them
// through their hooks, so a MoE call with LoRA runs exactly the kernels of the same call without.
void CudaBackend::moe_experts(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                              const cuda::ExpertPointers& pointers, const cuda::ExpertDeltas* deltas, Tensor& out) {
  const int64_t rows = h.dim(0), hidden = h.dim(1), top_k = expert_ids.dim(1);
  const int32_t experts = pointers.experts;
  const char* op = deltas != nullptr ? "moe_lora" : "moe";
  const int64_t assignments = rows * top_k;
  // One token: each expert has a single column, so the tensor-core tiles would be 1/8 full and the plan pass is
  // pure overhead; the streaming kernels do it in fewer launches. From two tokens on the tensor cores win
  // (bench/results/2026-11-30-moe.md).
  constexpr int64_t kMinMmaRows = 2;
  if (rows >= kMinMmaRows && cuda::moe_mma_supported(pointers.dtype, experts, hidden, pointers.intermediate)) {
    const int64_t max_tiles = cuda::moe_mma_max_tiles(assignments, experts);
    const cuda::OperandPrecision precision = operand_precision();
    const int64_t operands = cuda::operand_terms(precision);  // BF16 row sets: hi (Bf16) or hi, lo, lo2 (Split)
    Tensor h_split = scratch(DType::BF16, {operands, rows, hidden});
    Tensor grouped = scratch(DType::I32, {assignments});
    Tensor tiles = scratch(DType::I32, {max_tiles, 4});
    Tensor activated_split = scratch(DType::BF16, {operands, assignments, pointers.intermediate});
    Tensor expert_out = scratch(DType::F32, {assignments, hidden});
    cuda::MoeMmaWorkspace workspace;
    workspace.h = h_split.raw();
    workspace.grouped = grouped.data<int32_t>();
    workspace.tiles = tiles.data<int32_t>();
    workspace.activated = activated_split.raw();
    workspace.expert_out = expert_out.data<float>();
    workspace.max_tiles = max_tiles;
    check_launch(cuda::moe_mma(h.data<const float>(), expert_ids.data<const int32_t>(),
                               expert_weights.data<const float>(), rows, static_cast<int32_t>(top_k), pointers,
                               precision, workspace, out.data<float>(), stream_, deltas),
                 op);
    return;
  }
  if (rows == 1 && deltas == nullptr && aligned16(h.raw()) &&
      cuda::moe_token_staged_supported(pointers, static_cast<int32_t>(top_k))) {
    Tensor activated = scratch(DType::F32, {top_k, pointers.intermediate}), partial = scratch(DType::F32, {top_k, hidden});
    Tensor counters = scratch(DType::I32, {cuda::token_moe_counters(hidden)});
    const cuda::TokenMoeScratch token{activated.data<float>(), partial.data<float>(), counters.data<int32_t>()};
    check_launch(cuda::moe_token_staged(h.data<const float>(), expert_ids.data<const int32_t>(),
                                        expert_weights.data<const float>(), static_cast<int32_t>(top_k), pointers,
                                        token, out.data<float>(), stream_),
                 "moe (bf16 one token)");
    return;
  }
  if (cuda::moe_streaming_supported(assignments, hidden, pointers.intermediate)) {
    Tensor activated = scratch(DType::F32, {assignments, pointers.intermediate});
    Tensor expert_out = scratch(DType::F32, {assignments, hidden});
    check_launch(cuda::moe_streaming(h.data<const float>(), expert_ids.data<const int32_t>(),
                                     expert_weights.data<const float>(), rows, static_cast<int32_t>(top_k), pointers,
                                     activated.data<float>(), expert_out.data<float>(), out.data<float>(), stream_,
                                     /*row_invariant=*/false, deltas),
                 op);
    return;
  }
  const int64_t max_tiles = cuda::moe_max_tiles(assignments, experts);
  const int64_t padded_rows = max_tiles * cuda::kGroupedTileRows;
  Tensor counts = scratch(DType::I32, {3, experts});
  Tensor tile_expert = scratch(DType::I32, {max_tiles});
  Tensor slot_row = scratch(DType::I32, {assignments});
  Tensor row_token = scratch(DType::I32, {deltas != nullptr ? 2 : 1, padded_rows});
  Tensor activated = scratch(DType::F32, {padded_rows, pointers.intermediate});
  Tensor expert_out = scratch(DType::F32, {padded_rows, hidden});

  cuda::MoeWorkspace workspace;
  workspace.counts = counts.data<int32_t>();
  workspace.cursor = workspace.counts + experts;
  workspace.offsets = workspace.cursor + experts;
  workspace.tile_expert = tile_expert.data<int32_t>();
  workspace.slot_row = slot_row.data<int32_t>();
  workspace.row_token = row_token.data<int32_t>();
  if (deltas != nullptr) workspace.row_slot = workspace.row_token + padded_rows;
  workspace.activated = activated.data<float>();
  workspace.expert_out = expert_out.data<float>();
  workspace.max_tiles = max_tiles;
  check_launch(cuda::moe(h.data<const float>(), expert_ids.data<const int32_t>(), expert_weights.data<const float>(),
                         rows, static_cast<int32_t>(top_k), pointers, operand_precision(), workspace, out.data<float>(),
                         stream_, deltas),
               op);
}

// The streaming kernels' multi-token passes for every row count, in calls of at most kMaxStreamingAssignments slots
// (a token's slots never straddle two calls): each slot's dots stream its expert's rows in one order, and the combine
// sums a token's slots in j order, whatever the other tokens.
void CudaBackend::moe_invariant(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                                const cuda::ExpertPointers& experts, Tensor& out) {
  const int64_t rows = h.dim(0), hidden = h.dim(1), top_k = expert_ids.dim(1);
  require(cuda::moe_streaming_supported(top_k, hidden, experts.intermediate) && top_k <= cuda::kMaxStreamingAssignments,
          "moe: --batch-invariant on cuda needs H {} and I {} multiples of 8 and top_k {} <= {}", hidden,
          experts.intermediate, top_k, cuda::kMaxStreamingAssignments);
  const int64_t chunk = cuda::kMaxStreamingAssignments / top_k;
  const int64_t chunk_rows = std::min(rows, chunk);
  Tensor activated = scratch(DType::F32, {chunk_rows * top_k, experts.intermediate});
  Tensor expert_out = scratch(DType::F32, {chunk_rows * top_k, hidden});
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t count = std::min(chunk, rows - first);
    check_launch(cuda::moe_streaming(h.data<const float>() + first * hidden,
                                     expert_ids.data<const int32_t>() + first * top_k,
                                     expert_weights.data<const float>() + first * top_k, count,
                                     static_cast<int32_t>(top_k), experts, activated.data<float>(),
                                     expert_out.data<float>(), out.data<float>() + first * hidden, stream_,
                                     /*row_invariant=*/true),
                 "moe (batch-invariant)");
  }
}

void CudaBackend::moe_fp8(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                          const PackedExperts& packed, int32_t experts, Tensor& out) {
  const int64_t rows = h.dim(0), hidden = packed.hidden, inter = packed.intermediate, top_k = expert_ids.dim(1);
  cuda::fp8::Experts tables;
  const auto* weight_table = packed.pointers.data<const void* const>();
  const auto* scale_table = packed.scale_pointers.data<const float* const>();
  for (int m = 0; m < 3; ++m) {
    tables.weight[m] = weight_table + m * int64_t{experts};
    tables.scale[m] = scale_table + m * int64_t{experts};
    tables.maps[m] = packed.tensor_maps.data<const unsigned char>() + m * int64_t{experts} * cuda::fp8::kTensorMapBytes;
  }
  tables.experts = experts;
  tables.hidden = hidden;
  tables.intermediate = inter;
  // One token: the routed experts' weights streamed once with F32 activations (W8A16), two launches.
  if (rows == 1 && streaming_max_rows_ > 0 &&
      cuda::fp8::moe_one_token_supported(hidden, inter, static_cast<int32_t>(top_k))) {
    Tensor activated = scratch(DType::F32, {top_k, inter}), partial = scratch(DType::F32, {top_k, hidden});
    Tensor counters = scratch(DType::I32, {cuda::token_moe_counters(hidden)});
    const cuda::TokenMoeScratch token{activated.data<float>(), partial.data<float>(), counters.data<int32_t>()};
    check_launch(cuda::fp8::moe_one_token(h.data<const float>(), expert_ids.data<const int32_t>(),
                                          expert_weights.data<const float>(), static_cast<int32_t>(top_k), tables,
                                          token, out.data<float>(), stream_),
                 "moe (fp8 one token)");
    return;
  }
  const int64_t assignments = rows * top_k, max_tiles = cuda::fp8::moe_max_tiles(assignments, experts);
  Tensor hq = scratch(DType::U8, {rows, hidden}), hs = scratch(DType::F32, {rows, cuda::fp8::blocks_of(hidden)});
  Tensor grouped = scratch(DType::I32, {assignments}), tiles = scratch(DType::I32, {max_tiles, 4});
  Tensor activated = scratch(DType::F32, {assignments, inter}), aq = scratch(DType::U8, {assignments, inter});
  Tensor as = scratch(DType::F32, {assignments, cuda::fp8::blocks_of(inter)});
  Tensor expert_out = scratch(DType::F32, {assignments, hidden});
  cuda::fp8::MoeWorkspace workspace;
  workspace.h_q = hq.data<uint8_t>();
  workspace.h_scale = hs.data<float>();
  workspace.grouped = grouped.data<int32_t>();
  workspace.tiles = tiles.data<int32_t>();
  workspace.activated = activated.data<float>();
  workspace.activated_q = aq.data<uint8_t>();
  workspace.activated_scale = as.data<float>();
  workspace.expert_out = expert_out.data<float>();
  workspace.max_tiles = max_tiles;
  check_launch(cuda::fp8::moe(h.data<const float>(), expert_ids.data<const int32_t>(),
                              expert_weights.data<const float>(), rows, static_cast<int32_t>(top_k), tables, workspace,
                              out.data<float>(), stream_),
               "moe (fp8 wgmma)");
}

// Every token streams its routed experts' weights (micro.h): one token reads each routed weight byte once; more
// tokens read their experts again per token, correct but not yet a grouped GEMM.
void CudaBackend::moe_micro(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                            const PackedExperts& packed, int32_t experts, Tensor& out) {
  const int64_t rows = h.dim(0), top_k = expert_ids.dim(1);
  require(top_k <= cuda::micro::kMaxTopK, "moe: top_k {} exceeds the {} experts' {}", top_k,
          format_name(*packed.micro), cuda::micro::kMaxTopK);
  cuda::micro::Experts tables;
  tables.format = *packed.micro;
  const auto* codes = packed.pointers.data<const uint8_t* const>();
  const auto* scales = packed.scale_pointers.data<const uint8_t* const>();
  for (int m = 0; m < 3; ++m) {
    tables.codes[m] = codes + m * int64_t{experts};
    tables.scales[m] = scales + m * int64_t{experts};
    if (packed.scale_2_pointers.defined())
      tables.scale_2[m] = packed.scale_2_pointers.data<const float* const>() + m * int64_t{experts};
  }
  tables.experts = experts;
  tables.hidden = packed.hidden;
  tables.intermediate = packed.intermediate;
  tables.scales_aligned = packed.scales_aligned;
  Tensor activated = scratch(DType::F32, {rows * top_k, packed.intermediate});
  // The staged kernels' down pass, for the tokens of one of their calls.
  const int64_t call_tokens = std::min(rows, cuda::kTokenMoeMaxTokens);
  Tensor partial = scratch(DType::F32, {call_tokens * top_k, packed.hidden});
  Tensor counters = scratch(DType::I32, {call_tokens * cuda::token_moe_counters(packed.hidden)});
  const cuda::TokenMoeScratch token{activated.data<float>(), partial.data<float>(), counters.data<int32_t>()};
  check_launch(cuda::micro::moe_tokens(h.data<const float>(), expert_ids.data<const int32_t>(),
                                       expert_weights.data<const float>(), rows, static_cast<int32_t>(top_k), tables,
                                       token, out.data<float>(), stream_),
               packed.micro == cuda::micro::Format::Mxfp8 ? "moe (mxfp8)" : "moe (nvfp4)");
}

bool CudaBackend::swiglu_streaming(const Tensor& h, const SwigluTensors& mlp, Tensor& out) {
  const int64_t rows = h.dim(0), hidden = h.dim(1), intermediate = mlp.gate.weight.dim(0);
  if (rows > std::min(streaming_max_rows_, kStreamingSwigluMaxRows) ||
      !cuda::moe_streaming_supported(rows, hidden, intermediate))
    return false;
  const std::array<const void*, 3> key{mlp.gate.weight.raw(), mlp.up.weight.raw(), mlp.down.weight.raw()};
  auto [table, inserted] = dense_expert_tables_.try_emplace(key);
  if (inserted) {
    const int64_t pointers[3] = {reinterpret_cast<int64_t>(key[0]), reinterpret_cast<int64_t>(key[1]),
                                 reinterpret_cast<int64_t>(key[2])};
    table->second = upload(pointers, DType::I64, {3});
  }
  if (!dense_expert_ids_.defined()) {
    dense_expert_ids_ = upload_i32(std::vector<int32_t>(kStreamingSwigluMaxRows, 0), {kStreamingSwigluMaxRows, 1});
    dense_expert_weights_ = upload_f32(std::vector<float>(kStreamingSwigluMaxRows, 1.0f), {kStreamingSwigluMaxRows, 1});
  }
  cuda::ExpertPointers pointers;
  const auto* entries = table->second.data<const void* const>();
  pointers.gate = entries;
  pointers.up = entries + 1;
  pointers.down = entries + 2;
  pointers.dtype = mlp.gate.weight.dtype();
  pointers.experts = 1;
  pointers.hidden = hidden;
  pointers.intermediate = intermediate;
  Tensor activated = scratch(DType::F32, {rows, intermediate}), expert_out = scratch(DType::F32, {rows, hidden});
  check_launch(cuda::moe_streaming(h.data<const float>(), dense_expert_ids_.data<const int32_t>(),
                                   dense_expert_weights_.data<const float>(), rows, 1, pointers,
                                   activated.data<float>(), expert_out.data<float>(), out.data<float>(), stream_),
               "swiglu");
  return true;
}

// Few rows: gate and up streamed in one launch (W8A16), silu_mul, down streamed. More: h quantized, gate and up on
// cuBLASLt's block-scaled matmul where it takes the shapes (then silu_mul), else gate|up on FP8 wgmma with the SwiGLU
// fused; down through project_fp8 (W8A8).
void CudaBackend::swiglu_fp8(const Tensor& h, const SwigluTensors& mlp, Tensor& out) {
  const int64_t rows = h.dim(0), hidden = h.dim(1), intermediate = mlp.gate.weight.dim(0);
  Tensor activated = scratch(DType::F32, {rows, intermediate});
  const LinearTensors* const first[] = {&mlp.gate, &mlp.up};
  Tensor up = scratch(DType::F32, {rows, intermediate});
  float* const first_out[] = {activated.data<float>(), up.data<float>()};
  if (rows <= std::min(streaming_max_rows_, kFp8StreamingMaxRows) || fp8_cublas_takes(rows, first, first_out, 0.0f)) {
    // gate and up in one projection call (streamed, or two cuBLASLt matmuls on one quantization of h), silu_mul.
    project_fp8(h.data<const float>(), rows, first, first_out, 0.0f);
    check_launch(cuda::silu_mul(activated.data<float>(), up.data<const float>(), rows * intermediate, stream_),
                 "swiglu");
  } else {
    Tensor hq = scratch(DType::U8, {rows, hidden}), hs = scratch(DType::F32, {rows, cuda::fp8::blocks_of(hidden)});
    check_launch(cuda::fp8::quantize_rows(h.data<const float>(), rows, hidden, hq.data<uint8_t>(), hs.data<float>(),
                                          stream_),
                 "swiglu (fp8 quantize)");
    check_launch(cuda::fp8::gate_up(hq.data<const uint8_t>(), hs.data<const float>(), rows, hidden,
                                    mlp.gate.weight.raw(), mlp.gate.scale.data<const float>(), mlp.up.weight.raw(),
                                    mlp.up.scale.data<const float>(), intermediate, activated.data<float>(), stream_),
                 "swiglu (fp8 gate|up)");
  }
  const LinearTensors* const second[] = {&mlp.down};
  float* const second_out[] = {out.data<float>()};
  project_fp8(activated.data<const float>(), rows, second, second_out, 0.0f);
}

// gate and up in one projection call (one streaming launch for a row), silu_mul, down.
void CudaBackend::swiglu_micro(const Tensor& h, const SwigluTensors& mlp, Tensor& out) {
  const int64_t rows = h.dim(0), intermediate = mlp.gate.weight.dim(0);
  Tensor gate = scratch(DType::F32, {rows, intermediate}), up = scratch(DType::F32, {rows, intermediate});
  const LinearTensors* const first[] = {&mlp.gate, &mlp.up};
  float* const first_out[] = {gate.data<float>(), up.data<float>()};
  project_micro(h.data<const float>(), rows, first, first_out, 0.0f);
  check_launch(cuda::silu_mul(gate.data<float>(), up.data<const float>(), rows * intermediate, stream_), "swiglu");
  const LinearTensors* const second[] = {&mlp.down};
  float* const second_out[] = {out.data<float>()};
  project_micro(gate.data<const float>(), rows, second, second_out, 0.0f);
}

void CudaBackend::swiglu(const Tensor& h, const SwigluTensors& mlp, Tensor& out) {
  const auto timing = time_op("swiglu");
  require_device(h, "swiglu", "h");
  const int64_t rows = h.dim(0), hidden = h.dim(1);
  check_swiglu(mlp, hidden, "swiglu");
  require_shape(out, h.shape(), "swiglu", "out");
  if (rows == 0) return;
  if (batch_invariant_) {
    for (const LinearTensors* weight : {&mlp.gate, &mlp.up, &mlp.down}) require_row_invariant(*weight, "swiglu");
    const int64_t intermediate = mlp.gate.weight.dim(0);
    Tensor gate = scratch(DType::F32, {rows, intermediate}), up = scratch(DType::F32, {rows, intermediate});
    project_invariant(h.data<const float>(), rows, mlp.gate.weight, gate.data<float>(), 0.0f);
    project_invariant(h.data<const float>(), rows, mlp.up.weight, up.data<float>(), 0.0f);
    check_launch(cuda::silu_mul(gate.data<float>(), up.data<const float>(), rows * intermediate, stream_), "swiglu");
    project_invariant(gate.data<const float>(), rows, mlp.down.weight, out.data<float>(), 0.0f);
    return;
  }
  if (micro_format(mlp.gate)) {
    swiglu_micro(h, mlp, out);
    return;
  }
  if (is_fp8_block(mlp.gate)) {
    swiglu_fp8(h, mlp, out);
    return;
  }
  if (swiglu_streaming(h, mlp, out)) return;
  // Three projections, each weight read once: streamed for few rows (gate and up in one launch), else cuBLAS GEMMs.
  const int64_t intermediate = mlp.gate.weight.dim(0);
  Tensor gate = scratch(DType::F32, {rows, intermediate}), up = scratch(DType::F32, {rows, intermediate});
  if (mlp.gate.weight.dtype() == mlp.up.weight.dtype()) {  // h made into operands once for both
    const Tensor* const weights[] = {&mlp.gate.weight, &mlp.up.weight};
    float* const outputs[] = {gate.data<float>(), up.data<float>()};
    if (!project_streaming(h.data<const float>(), rows, weights, outputs, 0.0f, kStreamingSingleMaxRows))
      project_gemms(h.data<const float>(), rows, weights, outputs);
  } else {
    project(h.data<const float>(), rows, mlp.gate.weight, gate.data<float>());
    project(h.data<const float>(), rows, mlp.up.weight, up.data<float>());
  }
  check_launch(cuda::silu_mul(gate.data<float>(), up.data<const float>(), rows * intermediate, stream_), "swiglu");
  project(gate.data<const float>(), rows, mlp.down.weight, out.data<float>());
}

void CudaBackend::lm_head(const Tensor& x, const Tensor& rows, const Tensor& norm, float eps, const LinearTensors& head,
                          float softcap, Tensor& logits) {
  const auto timing = time_op("lm_head");
  if (batch_invariant_) require_row_invariant(head, "lm_head");
  if (micro_format(head)) {
    check_micro(head, "lm_head");
  } else if (is_fp8_block(head)) {
    check_fp8_block(head, "lm_head");
  } else {
    require_float_weight(head.weight, "lm_head", "head");
    require_unquantized(head, "lm_head");
  }
  require_float_weight(norm, "lm_head", "norm");
  require_device(x, "lm_head", "x");
  require_device(rows, "lm_head", "rows");
  const int64_t hidden = x.dim(1), selected = rows.numel(), vocab = head.weight.dim(0);
  require(head.weight.rank() == 2 && logical_in(head) == hidden, "lm_head: head {} does not take {} features", describe(head.weight), hidden);
  require_shape(norm, {hidden}, "lm_head", "norm");
  require_dtype(rows, DType::I32, "lm_head", "rows");
  require_shape(logits, {selected, vocab}, "lm_head", "logits");
  require_dtype(logits, DType::F32, "lm_head", "logits");
  if (selected == 0) return;
  Tensor normed = scratch(DType::F32, {selected, hidden});
  check_launch(cuda::gather_rms_norm(x.data<const float>(), x.dim(0), rows.data<const int32_t>(), selected, norm.raw(),
                                     norm.dtype(), eps, hidden, normed.data<float>(), DType::F32, stream_),
               "lm_head");
  if (batch_invariant_) {
    project_invariant(normed.data<const float>(), selected, head.weight, logits.data<float>(), softcap);
    return;
  }
  if (micro_format(head)) {
    const LinearTensors* const heads[] = {&head};
    float* const head_out[] = {logits.data<float>()};
    project_micro(normed.data<const float>(), selected, heads, head_out, softcap);
    return;
  }
  if (is_fp8_block(head)) {
    const LinearTensors* const heads[] = {&head};
    float* const head_out[] = {logits.data<float>()};
    project_fp8(normed.data<const float>(), selected, heads, head_out, softcap);
    return;
  }
  const Tensor* const weights[] = {&head.weight};
  float* const outputs[] = {logits.data<float>()};
  if (project_streaming(normed.data<const float>(), selected, weights, outputs, softcap, kStreamingMaxRows)) return;
  project(normed.data<const float>(), selected, head.weight, logits.data<float>());
  if (softcap > 0.0f) check_launch(cuda::soft_cap(logits.data<float>(), selected * vocab, softcap, stream_), "lm_head");
}

void CudaBackend::sample(const Tensor& logits, std::span<const SampleRow> rows, SampleOutputs& out) {
  const auto timing = time_op("sample");
  require_device(logits, "sample", "logits");
  const int32_t max_logprobs = check_sample_args(logits, rows, out);
  require_device(out.tokens, "sample", "tokens");
  if (rows.empty()) return;
  std::vector<cuda::SampleRowParams> params(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const SampleRow& row = rows[i];
    params[i].uniform = row.uniform;
    params[i].logit_row = row.logit_row;
    params[i].greedy = row.greedy ? 1 : 0;
    params[i].top_k = row.top_k;
    params[i].num_logprobs = row.num_logprobs;
    params[i].temperature = row.temperature;
    params[i].min_p = row.min_p;
    params[i].top_p = row.top_p;
  }
  const Tensor device_params = upload(params.data(), DType::U8,
                                      {static_cast<int64_t>(params.size() * sizeof(cuda::SampleRowParams))});
  int32_t width = 0;
  if (max_logprobs >= 0) {
    for (const Tensor* t : {&out.logprobs, &out.ranks, &out.top_ids, &out.top_logprobs})
      require_device(*t, "sample", "logprob output");
    width = static_cast<int32_t>(out.top_ids.dim(1));
  }
  check_launch(cuda::sample(logits.data<const float>(), logits.dim(1),
                            reinterpret_cast<const cuda::SampleRowParams*>(device_params.raw()),
                            static_cast<int32_t>(rows.size()), out.tokens.data<int32_t>(),
                            max_logprobs >= 0 ? out.logprobs.data<float>() : nullptr,
                            max_logprobs >= 0 ? out.ranks.data<int32_t>() : nullptr,
                            max_logprobs >= 0 ? out.top_ids.data<int32_t>() : nullptr,
                            max_logprobs >= 0 ? out.top_logprobs.data<float>() : nullptr, width, stream_,
                            batch_invariant_),
               "sample");
}

void CudaBackend::mask_logits(Tensor& logits, std::span<const int32_t> rows, const Tensor& allowed) {
  const auto timing = time_op("mask_logits");
  require_device(logits, "mask_logits", "logits");
  require_device(allowed, "mask_logits", "allowed");
  check_mask_logits_args(logits, rows, allowed);
  if (rows.empty()) return;
  const Tensor device_rows = upload(rows.data(), DType::I32, {static_cast<int64_t>(rows.size())});
  check_launch(cuda::mask_logits(logits.data<float>(), logits.dim(1), device_rows.data<const int32_t>(),
                                 reinterpret_cast<const uint32_t*>(allowed.data<const int32_t>()), allowed.dim(1),
                                 static_cast<int32_t>(rows.size()), stream_),
               "mask_logits");
}

}  // namespace beamline

#pragma once
// The CUDA backend (Hopper, sm_90a): the op set of backend.h on one device and one stream. Linear layers of few
// rows (decode) stream their weights through this folder's kernels with F32 activations; more rows, and the
// router's logits, go through cuBLAS (BF16/F16 weights times F32 activations split into two BF16/F16 operands,
// FP32 accumulation; the router in FP32); the other ops are this folder's kernels, one launcher header per family
// (attention/, linear/, lora/, moe/, rows/, sampling/). Registered as device "cuda" when the library is linked in.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/common/device_memory.h"
#include "backend/cuda/rows/rows.h"
#include "backend/cuda/linear/projection.h"
#include "backend/cuda/linear/row_invariant.h"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/sampling/sampling.h"
#include "backend/cuda/common/op_times.h"
#include "backend/cuda/quant/fp8.h"

namespace beamline {

struct PackedExperts;  // cuda_backend.cpp: one MoE layer's device tables
namespace cuda::fp8 {
class BlockScaledGemm;  // quant/fp8_cublaslt.h
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::Cuda; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
  void fill_zero(Tensor& tensor) override;
  Tensor upload(const void* host, DType dtype, std::vector<int64_t> shape) override;
  void download(const Tensor& tensor, void* host) override;
  std::unique_ptr<PendingDownload> download_later(const Tensor& tensor, void* host) override;
  void copy_to(Tensor& tensor, const void* host) override;
  void synchronize() override;
  std::optional<MemoryInfo> memory_info() override;
  void set_compute_dtype(ComputeDType dtype) override { compute_dtype_ = dtype; }
  ComputeDType compute_dtype() const override { return compute_dtype_; }
  // Batch-invariant mode: one kernel configuration per op for every row count (docs/cuda-backend.md lists the ops and
  // the choices the default makes by rows): projections, the dense SwiGLU and the LM head on
  // cuda::project_row_invariant, the router's logits on router_gemv, the experts on the multi-token streaming
  // kernels, attention on the one-block-per-(row, kv head) kernel, sampling clusters sized by the vocabulary alone.
  // BF16/F16/F32 weights only (quantized ones are refused naming the op).
  bool set_batch_invariant(bool on) override {
    batch_invariant_ = on;
    return true;
  }
  Tensor load_weight(const TensorView& view) override;
  Tensor random_weight(DType dtype, std::vector<int64_t> shape, uint64_t key, float mean, float stddev) override;
  void reserve_weights(std::span<const std::size_t> tensor_bytes) override { weights_.reserve(tensor_bytes); }
  void prepare_moe(MoeTensors& moe) override;

  bool supports_graphs() const override { return true; }
  void begin_capture() override;
  std::unique_ptr<OpGraph> end_capture() override;
  void replay(const OpGraph& graph) override;
  std::optional<std::string> attention_signature(const AttentionBatch& batch, const PagedKvPool& pool,
                                                 const AttentionParams& params) const override;

  void place_tokens(const Tensor& source, std::span<const int32_t> pairs, Tensor& tokens) override;
  void embedding(const Tensor& table, const Tensor& tokens, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale) override;
  void add_rms_norm_then_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale,
                              const Tensor& next_weight, Tensor& out) override;
  void add_rms_norm_then_route(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale,
                               const Tensor& next_weight, Tensor& out, const Tensor& router, const Tensor& bias,
                               const RouterParams& params, Tensor& expert_ids, Tensor& expert_weights) override;
  void all_reduce_add_rms_norm(std::span<const Tensor> partials, Tensor& residual, const Tensor& weight, float eps,
                               float scale, const Tensor& next_weight, Tensor& out) override;
  void linear(const Tensor& x, const LinearTensors& weight, Tensor& y) override;
  void linear_many(const Tensor& x, std::span<const LinearTensors* const> weights,
                   std::span<Tensor* const> ys) override;
  void rope(Tensor& x, const Tensor& positions, int32_t num_heads, int32_t head_dim, float theta) override;
  void rope_qk(Tensor& q, Tensor& k, const Tensor& positions, int32_t num_heads, int32_t num_kv_heads,
               int32_t head_dim, float theta) override;
  void ssmax_scale(Tensor& q, const Tensor& positions, float base, float exponent) override;
  void amax_scale(const Tensor& x, float divisor, Tensor& out) override;
  void write_kv(const Tensor& k, const Tensor& v, PagedKvPool& pool, int32_t slot, const Tensor& block_table,
                const AttentionBatch& batch) override;
  void paged_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                       const AttentionBatch& batch, const AttentionParams& params, Tensor& out) override;
  void block_attention(const Tensor& q, const PagedKvPool& pool, const Tensor& block_table,
                       const AttentionBatch& blocks, const AttentionParams& params, Tensor& out) override;
  void route(const Tensor& h, const Tensor& router, const Tensor& bias, const RouterParams& params,
             Tensor& expert_ids, Tensor& expert_weights) override;
  void moe(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
           Tensor& out) override;
  void moe_lora(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
                const SwigluLora& lora, Tensor& out) override;
  void lora(const Tensor& x, const LoraTensors& lora, const Tensor& indices, Tensor& y) override;
  void swiglu(const Tensor& h, const SwigluTensors& mlp, Tensor& out) override;
  void lm_head(const Tensor& x, const Tensor& rows, const Tensor& norm, float eps, const LinearTensors& head,
               float softcap, Tensor& logits) override;
  void sample(const Tensor& logits, std::span<const SampleRow> rows, SampleOutputs& out) override;
  void mask_logits(Tensor& logits, std::span<const int32_t> rows, const Tensor& allowed) override;

  // ---- beyond the interface: the harness and benchmarks ----
  std::string device_description() const;  // "NVIDIA H200 (sm_90, 132 SMs, 141 GiB)"
  cuda::AllocatorStats allocator_stats() const { return allocator_.stats(); }
  cudaStream_t stream() const { return stream_; }
  // The W8A8 paths' activation quantizer on its own (x [rows, cols] F32 -> codes U8 [rows, cols], scales F32
  // [rows, ceil(cols/128)]), for the harness to hold against quant/activation_quant.h bit for bit.
  void quantize_fp8_rows(const Tensor& x, Tensor& codes, Tensor& scales);
  // Up to this many rows, projections stream their weights through the CUDA cores (exact, one pass); more go to
  // cuBLAS. 0 sends everything to cuBLAS (the benchmarks' comparison; BEAMLINE_CUDA_STREAMING_ROWS sets it at
  // start, for A/B runs of whole decode steps).
  void set_streaming_max_rows(int64_t rows) { streaming_max_rows_ = rows; }
  // The crossovers with the cuBLAS GEMMs measured by `backend_ops perf linear` (bench/results/2026-12-01-linear.md and
  // -gpu-perf.md): q|k|v in one launch and the LM head stream up to 2 rows; a lone projection (o, the dense MLP's)
  // only 1, since at 2 rows cuBLAS reads o and the dense MLP faster.
  // The SwiGLU of one row streams through the experts' one-token kernels.
  static constexpr int64_t kStreamingMaxRows = 2;
  static constexpr int64_t kStreamingSingleMaxRows = 1;
  // Whatever the op, weights of at most kSmallWeightBytes in one call (a drafter's or a small model's, where a step is
  // bound by launches and latency, not by bytes) stream up to kSmallStreamingMaxRows rows: one launch where cuBLAS
  // takes two (the activations' rounding, the GEMM), so that a drafter pass at batch 1 (8 rows) or a verify step of
  // 1 + 7 rows launches a kernel per projection.
  static constexpr int64_t kSmallStreamingMaxRows = cuda::kMaxProjectionRows;
  static constexpr int64_t kSmallWeightBytes = int64_t{4} << 20;
  static constexpr int64_t kStreamingSwigluMaxRows = 1;
  // FP8 block-128 weights stream (W8A16, quant/fp8.h) up to this many rows, in every op; more rows take the FP8
  // wgmma GEMMs (W8A8). The MoE streams one token (set_streaming_max_rows(0) sends it to wgmma too). One row: at two
  // the streaming kernel re-reads its F32 activations from L1 for every 16 weight bytes and was 1.7-4x slower than
  // wgmma on the H200 (bench/results/2026-12-02-fp8.md).
  static constexpr int64_t kFp8StreamingMaxRows = 1;
  // From this many rows, FP8 projections (and the dense SwiGLU's gate and up) whose shapes cuBLASLt's block-scaled
  // matmul takes (quant/fp8_cublaslt.h: rows a multiple of 4, ceil(in/128) a multiple of 4) run there instead of on
  // the wgmma GEMMs; BEAMLINE_CUDA_FP8_CUBLAS_ROWS sets it at start and set_fp8_cublas_min_rows for the benchmarks
  // (a large value: wgmma only).
  static constexpr int64_t kFp8CublasMinRows = 4;
  void set_fp8_cublas_min_rows(int64_t rows) { fp8_cublas_min_rows_ = rows; }
  int64_t fp8_cublas_min_rows() const { return fp8_cublas_min_rows_; }
  // Whether an FP8 projection of these sizes (above the streamed rows) runs on cuBLASLt now: the benchmarks' label.
  bool fp8_cublas_path(int64_t rows, int64_t in, int64_t out);
  // MXFP8 and NVFP4 weights (quant/micro.h) stream one row per launch up to this many rows (a launch per row; the
  // MoE token by token at any count); more rows decode each weight to BF16 for the BF16 GEMMs.
  static constexpr int64_t kMicroStreamingMaxRows = 1;

 private:
  // y[rows, out] = x[rows, in] W[out, in]ᵀ for F32 x: BF16/F16 weights through split_f32, hi + lo + lo2 (what FP32
  // arithmetic gives) or hi alone (OperandPrecision::Bf16).
  void project(const float* x, int64_t rows, const Tensor& weight, float* y);
  // ys[i] = x weights[i]ᵀ on cuBLAS for weights of one dtype and width, x made into BF16/F16 operands once for all.
  void project_gemms(const float* x, int64_t rows, std::span<const Tensor* const> weights, std::span<float* const> ys);
  // ys[i] = x weights[i]ᵀ (soft-capped when softcap > 0) in one weight-streaming launch, when the rows are few
  // enough and the weights suit cuda::project_rows; false (nothing done) otherwise.
  bool project_streaming(const float* x, int64_t rows, std::span<const Tensor* const> weights,
                         std::span<float* const> ys, float softcap, int64_t max_rows);
  // The dense SwiGLU of kStreamingSwigluMaxRows rows as a one-expert MoE through the experts' streaming kernels
  // (gate|up with the SwiGLU fused, then down); false (nothing done) when they do not apply.
  bool swiglu_streaming(const Tensor& h, const SwigluTensors& mlp, Tensor& out);
  // ys[i] = x weights[i]ᵀ for FP8 block-128 weights of one width (softcapped when softcap > 0): streamed for few rows,
  // else the rows quantized once and one FP8 wgmma GEMM per weight.
  void project_fp8(const float* x, int64_t rows, std::span<const LinearTensors* const> weights,
                   std::span<float* const> ys, float softcap);
  void swiglu_fp8(const Tensor& h, const SwigluTensors& mlp, Tensor& out);
  // Whether ys[i] = x weights[i]ᵀ of `rows` rows goes to cuBLASLt's block-scaled matmul (no soft cap, every weight's
  // shape supported, 16-byte aligned outputs); fp8_cublas runs it: x quantized once (token-major scales), a matmul per
  // weight.
  bool fp8_cublas_takes(int64_t rows, std::span<const LinearTensors* const> weights, std::span<float* const> ys,
                        float softcap);
  void fp8_cublas(const float* x, int64_t rows, std::span<const LinearTensors* const> weights,
                  std::span<float* const> ys);
  // The same for MXFP8 / NVFP4 weights of one format and width: streamed (one launch per row) up to
  // kMicroStreamingMaxRows rows, else each weight decoded exactly to BF16 scratch and projected by the BF16 GEMMs.
  void project_micro(const float* x, int64_t rows, std::span<const LinearTensors* const> weights,
                     std::span<float* const> ys, float softcap);
  void swiglu_micro(const Tensor& h, const SwigluTensors& mlp, Tensor& out);
  void moe_micro(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const PackedExperts& packed,
                 int32_t experts, Tensor& out);
  void moe_fp8(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const PackedExperts& packed,
               int32_t experts, Tensor& out);
  // --batch-invariant's projection (softcapped when softcap > 0) and MoE.
  void project_invariant(const float* x, int64_t rows, const Tensor& weight, float* y, float softcap);
  void moe_invariant(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                     const cuda::ExpertPointers& experts, Tensor& out);
  void moe_experts(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights,
                   const cuda::ExpertPointers& experts, const cuda::ExpertDeltas* deltas, Tensor& out);
  // y[rows, out] = x[rows, in] W[out, in]ᵀ with x already in W's dtype (or F32 for F32 weights).
  void gemm_wt(const void* x, DType dtype, int64_t rows, int64_t in, const Tensor& weight, float* y);
  Tensor scratch(DType dtype, std::vector<int64_t> shape) { return alloc(dtype, std::move(shape)); }

  cuda::OperandPrecision operand_precision() const {
    return compute_dtype_ == ComputeDType::Float32 ? cuda::OperandPrecision::Split : cuda::OperandPrecision::Bf16;
  }

  void require_not_capturing(std::string_view op) const;
  // rope's and rope_qk's checks of one rotated tensor `what` [T, num_heads * head_dim] and its positions [T].
  void check_rope(const Tensor& x, const Tensor& positions, int32_t num_heads, int32_t head_dim, const char* op,
                  const char* what) const;
  // Device time of the op that the returned scope spans, with BEAMLINE_CUDA_OP_TIMES=1 (cuda/op_times.h).
  cuda::OpTimes::Scope time_op(const char* op) {
    return cuda::OpTimes::Scope(capturing_ ? nullptr : op_times_.get(), op);
  }
  // The plan paged_attention launches for `batch` (host data only).
  cuda::AttentionPlan attention_plan(const AttentionBatch& batch, const PagedKvPool& pool, const AttentionParams& params,
                                     bool aligned) const;
  // A plan's work list on the device. While a graph is recorded it cannot be uploaded, so the lists are kept by
  // content: the op-by-op run before a recording (runner/decode_graphs) uploads the list, the recording finds it, and
  // a list a graph was recorded with stays for the backend's lifetime (the graph reads it on every replay).
  const Tensor& attention_work(const std::vector<int32_t>& work);

  int device_ = 0;
  ComputeDType compute_dtype_ = ComputeDType::Float32;
  bool batch_invariant_ = false;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::CachingAllocator allocator_;
  cuda::WeightArena weights_;
  std::unique_ptr<cuda::PinnedStaging> staging_;
  cuda::PinnedReadbackPool readback_;
  Tensor cublas_workspace_;
  Tensor route_arrivals_;  // cuda::route_fused's arrival count: 0 between launches
  std::unique_ptr<cuda::OpTimes> op_times_;  // null unless BEAMLINE_CUDA_OP_TIMES=1
  bool capturing_ = false;  // a graph is being recorded (its tensors come from the allocator's graph pool)
  int64_t weights_loaded_ = 0;
  int64_t streaming_max_rows_ = kStreamingMaxRows;
  int64_t fp8_cublas_min_rows_ = kFp8CublasMinRows;
  std::unique_ptr<cuda::fp8::BlockScaledGemm> fp8_gemm_;
  // swiglu_streaming's one-expert pointer tables by (gate, up, down), and its routing: expert 0 with weight 1.
  std::map<std::array<const void*, 3>, Tensor> dense_expert_tables_;
  Tensor dense_expert_ids_, dense_expert_weights_;
  std::size_t weight_bytes_logged_ = 0;
  struct AttentionWork {
    Tensor device;
    bool recorded = false;  // a graph reads it: kept
  };
  std::map<std::vector<int32_t>, AttentionWork> attention_work_;
};

std::unique_ptr<Backend> make_cuda_backend();

}  // namespace beamline

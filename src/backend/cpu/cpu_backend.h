#pragma once
// The CPU reference backend: portable C++ (AVX2 where the build targets it), FP32 accumulation, weights read
// in their stored dtype straight from the mmap'd checkpoint, multithreaded with ThreadPool::global() over
// rows, heads and experts.
#include <memory>

#include "backend/backend.h"

namespace beamline {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::Cpu; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
  void fill_zero(Tensor& tensor) override;
  Tensor upload(const void* host, DType dtype, std::vector<int64_t> shape) override;
  void download(const Tensor& tensor, void* host) override;
  void copy_to(Tensor& tensor, const void* host) override;
  Tensor load_weight(const TensorView& view) override;
  Tensor random_weight(DType dtype, std::vector<int64_t> shape, uint64_t key, float mean, float stddev) override;
  // Batch-invariant by construction, flag or not: matmul_wt's one dot per output in a fixed order, attention per row
  // and head over its keys in order, moe per (token, slot) summed in slot order, norms and sampling per row.
  bool set_batch_invariant(bool on) override {
    (void)on;
    return true;
  }

  void place_tokens(const Tensor& source, std::span<const int32_t> pairs, Tensor& tokens) override;
  void embedding(const Tensor& table, const Tensor& tokens, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale) override;
  void all_reduce_add_rms_norm(std::span<const Tensor> partials, Tensor& residual, const Tensor& weight, float eps,
                               float scale, const Tensor& next_weight, Tensor& out) override;
  void linear(const Tensor& x, const LinearTensors& weight, Tensor& y) override;
  void rope(Tensor& x, const Tensor& positions, int32_t num_heads, int32_t head_dim, float theta) override;
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
                const SwigluLora& lora, Tensor& out) override;                              // moe.cpp
  void lora(const Tensor& x, const LoraTensors& lora, const Tensor& indices, Tensor& y) override;  // moe.cpp
  void swiglu(const Tensor& h, const SwigluTensors& mlp, Tensor& out) override;
  void lm_head(const Tensor& x, const Tensor& rows, const Tensor& norm, float eps, const LinearTensors& head,
               float softcap, Tensor& logits) override;
  void sample(const Tensor& logits, std::span<const SampleRow> rows, SampleOutputs& out) override;  // sample.cpp
  void mask_logits(Tensor& logits, std::span<const int32_t> rows, const Tensor& allowed) override;  // sample.cpp
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace beamline

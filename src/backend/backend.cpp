#include "backend/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>


#include "util/error.h"

namespace beamline {

Tensor Tensor::slice_first(int64_t index) const {
  require(rank() >= 1 && index >= 0 && index < dim(0), "slice_first: index {} of {}", index, describe(*this));
  std::vector<int64_t> shape(shape_.begin() + 1, shape_.end());
  const std::size_t stride = nbytes() / static_cast<std::size_t>(dim(0));
  return Tensor(device_, dtype_, std::move(shape), data_ + static_cast<std::size_t>(index) * stride, storage_);
}

Tensor Tensor::view(int64_t first, std::vector<int64_t> shape) const {
  Tensor result(device_, dtype_, std::move(shape), nullptr, storage_);
  require(first >= 0 && first + result.numel() <= numel(), "view of elements [{}, {}) of {}", first,
          first + result.numel(), describe(*this));
  result.data_ = data_ + static_cast<std::size_t>(first) * dtype_size(dtype_);
  return result;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  Tensor result = *this;
  result.shape_ = std::move(shape);
  require(result.numel() == numel(), "reshape of {} to {}: element counts differ", describe(*this),
          shape_string(result.shape_));
  return result;
}

std::string describe(const Tensor& tensor) {
  return fmt::format("{}{}", dtype_name(tensor.dtype()), shape_string(tensor.shape()));
}

void require_shape(const Tensor& tensor, const std::vector<int64_t>& shape, std::string_view op,
                   std::string_view what) {
  require(tensor.defined(), "{}: {} is not allocated", op, what);
  require(tensor.shape() == shape, "{}: {} has shape {}, expected {}", op, what, shape_string(tensor.shape()),
          shape_string(shape));
}

void require_dtype(const Tensor& tensor, DType dtype, std::string_view op, std::string_view what) {
  require(tensor.dtype() == dtype, "{}: {} is {}, expected {}", op, what, dtype_name(tensor.dtype()),
          dtype_name(dtype));
}

void Backend::linear_many(const Tensor& x, std::span<const LinearTensors* const> weights, std::span<Tensor* const> ys) {
  require(weights.size() == ys.size(), "linear_many: {} weights for {} outputs", weights.size(), ys.size());
  for (std::size_t i = 0; i < weights.size(); ++i) linear(x, *weights[i], *ys[i]);
}

void Backend::add_rms_norm_then_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale,
                                     const Tensor& next_weight, Tensor& out) {
  add_rms_norm(residual, y, weight, eps, scale);
  rms_norm(residual, next_weight, eps, out);
}

void Backend::rope_qk(Tensor& q, Tensor& k, const Tensor& positions, int32_t num_heads, int32_t num_kv_heads,
                      int32_t head_dim, float theta) {
  rope(q, positions, num_heads, head_dim, theta);
  rope(k, positions, num_kv_heads, head_dim, theta);
}

void Backend::add_rms_norm_then_route(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale,
                                      const Tensor& next_weight, Tensor& out, const Tensor& router, const Tensor& bias,
                                      const RouterParams& params, Tensor& expert_ids, Tensor& expert_weights) {
  add_rms_norm_then_norm(residual, y, weight, eps, scale, next_weight, out);
  route(out, router, bias, params, expert_ids, expert_weights);
}

void Backend::moe_lora(const Tensor& h, const Tensor& expert_ids, const Tensor& expert_weights, const MoeTensors& moe,
                       const SwigluLora& lora, Tensor& out) {
  (void)h, (void)expert_ids, (void)expert_weights, (void)moe, (void)lora, (void)out;
  fail("moe_lora: LoRA on MLP and expert projections is not implemented on the {} backend (docs/lora.md)", name());
}

Tensor Backend::upload_f32(std::span<const float> host, std::vector<int64_t> shape) {
  Tensor tensor = upload(host.data(), DType::F32, std::move(shape));
  require(static_cast<std::size_t>(tensor.numel()) == host.size(), "upload_f32: {} values for shape {}",
          host.size(), shape_string(tensor.shape()));
  return tensor;
}

Tensor Backend::upload_i32(std::span<const int32_t> host, std::vector<int64_t> shape) {
  Tensor tensor = upload(host.data(), DType::I32, std::move(shape));
  require(static_cast<std::size_t>(tensor.numel()) == host.size(), "upload_i32: {} values for shape {}",
          host.size(), shape_string(tensor.shape()));
  return tensor;
}

std::vector<float> Backend::download_f32(const Tensor& tensor) {
  require_dtype(tensor, DType::F32, "download_f32", "tensor");
  std::vector<float> host(static_cast<std::size_t>(tensor.numel()));
  download(tensor, host.data());
  return host;
}

std::vector<int32_t> Backend::download_i32(const Tensor& tensor) {
  require_dtype(tensor, DType::I32, "download_i32", "tensor");
  std::vector<int32_t> host(static_cast<std::size_t>(tensor.numel()));
  download(tensor, host.data());
  return host;
}

AttentionBatch Backend::describe_attention_batch(std::vector<int32_t> positions, std::vector<int32_t> query_start,
                                                 std::vector<int32_t> seq_lens) {
  require(query_start.size() == seq_lens.size() + 1, "attention batch: {} query starts for {} sequences",
          query_start.size(), seq_lens.size());
  require(query_start.front() == 0 && static_cast<std::size_t>(query_start.back()) == positions.size(),
          "attention batch: query starts must run from 0 to the {} rows", positions.size());
  AttentionBatch batch;
  batch.host_row_sequence.resize(positions.size());
  for (std::size_t s = 0; s < seq_lens.size(); ++s) {
    require(query_start[s] <= query_start[s + 1], "attention batch: query starts decrease at sequence {}", s);
    batch.max_query_len = std::max(batch.max_query_len, query_start[s + 1] - query_start[s]);
    batch.max_seq_len = std::max(batch.max_seq_len, seq_lens[s]);
    for (int32_t r = query_start[s]; r < query_start[s + 1]; ++r) {
      require(positions[r] >= 0 && positions[r] < seq_lens[s],
              "attention batch: row {} at position {} is outside its sequence of length {}", r, positions[r],
              seq_lens[s]);
      batch.host_row_sequence[r] = static_cast<int32_t>(s);
    }
  }
  batch.host_positions = std::move(positions);
  batch.host_query_start = std::move(query_start);
  batch.host_seq_lens = std::move(seq_lens);
  return batch;
}

AttentionBatch Backend::make_attention_batch(std::vector<int32_t> positions, std::vector<int32_t> query_start,
                                             std::vector<int32_t> seq_lens) {
  AttentionBatch batch = describe_attention_batch(std::move(positions), std::move(query_start), std::move(seq_lens));
  const int64_t rows = batch.num_rows(), sequences = batch.num_sequences();
  batch.positions = upload_i32(batch.host_positions, {rows});
  batch.row_sequence = upload_i32(batch.host_row_sequence, {rows});
  batch.query_start = upload_i32(batch.host_query_start, {sequences + 1});
  batch.seq_lens = upload_i32(batch.host_seq_lens, {sequences});
  return batch;
}

namespace {
struct CompletedDownload final : PendingDownload {
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingDownload> Backend::download_later(const Tensor& tensor, void* host) {
  download(tensor, host);
  return std::make_unique<CompletedDownload>();
}

void Backend::begin_capture() { fail("backend {} records no op graphs", name()); }
std::unique_ptr<OpGraph> Backend::end_capture() { fail("backend {} records no op graphs", name()); }
void Backend::replay(const OpGraph&) { fail("backend {} records no op graphs", name()); }

ComputeDType parse_compute_dtype(std::string_view name, Device device) {
  if (name == "auto") return device == Device::Cpu ? ComputeDType::Float32 : ComputeDType::BFloat16;
  if (name == "bfloat16" || name == "bf16") return ComputeDType::BFloat16;
  if (name == "float32" || name == "float" || name == "f32") return ComputeDType::Float32;
  fail("--dtype: \"{}\" is not a compute dtype (auto, bfloat16 or float32)", name);
}

DType parse_kv_cache_dtype(std::string_view name, ComputeDType compute) {
  if (name == "auto") return compute == ComputeDType::Float32 ? DType::F32 : DType::BF16;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  if (name == "float32" || name == "float" || name == "f32") return DType::F32;
  // vLLM's fp8 is E4M3 (fp8_e5m2 is not offered), with per-layer scales (PagedKvPool::scales).
  if (name == "fp8" || name == "fp8_e4m3") return DType::F8_E4M3;
  fail("--kv-cache-dtype: \"{}\" is not a KV cache dtype (auto, bfloat16, float32 or fp8)", name);
}

}  // namespace beamline

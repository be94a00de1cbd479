#include "backend/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/projection.h"
#include "backend/op_checks.h"
#include "util/counter_random.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {
namespace {

void require_float_weight(const Tensor& weight, std::string_view op, std::string_view what) {
  require(weight.defined(), "{}: {} is not loaded", op, what);
  const DType dtype = weight.dtype();
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16, "{}: {} is {}, expected F32, BF16 or F16",
          op, what, dtype_name(dtype));
}

// residual_row += scale * rms(y_row, weight): add_rms_norm's row, shared with all_reduce_add_rms_norm.
void add_rms_row(const float* y_row, const Tensor& weight, float eps, float scale, int64_t hidden, float* residual_row) {
  thread_local std::vector<float> normed;
  normed.resize(static_cast<std::size_t>(hidden));
  cpu::rms_row(y_row, weight, eps, hidden, normed.data());
  for (int64_t i = 0; i < hidden; ++i) residual_row[i] += scale * normed[static_cast<std::size_t>(i)];
}

// Rows of an [T, n] activation, parallel over rows.
template <typename Body>
void for_each_row(int64_t rows, int64_t row_size, const Body& body) {
  const auto min_chunk = static_cast<std::size_t>(std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_size)));
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(rows),
      [&](std::size_t begin, std::size_t end) {
        for (auto row = static_cast<int64_t>(begin); row < static_cast<int64_t>(end); ++row) body(row);
      },
      min_chunk);
}

// Allocations this large come straight from mmap, so that fill_zero can give their pages back to the kernel
// (MADV_DONTNEED: a private anonymous page then reads as zeros) instead of writing every byte: a KV pool of
// gigabytes is ready at once and costs memory only where sequences have written.
constexpr std::size_t kMappedBytes = std::size_t{16} << 20;
constexpr std::uintptr_t kPageBytes = 4096;

// The live mmap'd allocations, base -> bytes. Never destroyed: tensors may outlive static destruction.
struct MappedRegions {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> regions;

  bool contains(std::uintptr_t begin, std::size_t bytes) {
    std::lock_guard lock(mutex);
    auto after = regions.upper_bound(begin);
    if (after == regions.begin()) return false;
    const auto& [base, size] = *std::prev(after);
    return begin + bytes <= base + size;
  }
};
MappedRegions& mapped_regions() {
  static auto* regions = new MappedRegions;
  return *regions;
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

Tensor CpuBackend::alloc(DType dtype, std::vector<int64_t> shape) {
  for (int64_t d : shape) require(d >= 0, "alloc: negative dimension in shape {}", shape_string(shape));
  Tensor probe(Device::Cpu, dtype, shape, nullptr, nullptr);
  constexpr std::size_t kAlignment = 64;
  const std::size_t bytes = std::max<std::size_t>(kAlignment, (probe.nbytes() + kAlignment - 1) / kAlignment * kAlignment);
  if (bytes >= kMappedBytes) {
    void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    require(memory != MAP_FAILED, "alloc: out of memory for {} ({} bytes)", describe(probe), bytes);
    MappedRegions& mapped = mapped_regions();
    {
      std::lock_guard lock(mapped.mutex);
      mapped.regions.emplace(reinterpret_cast<std::uintptr_t>(memory), bytes);
    }
    std::shared_ptr<void> storage(memory, [bytes](void* base) {
      MappedRegions& regions = mapped_regions();
      {
        std::lock_guard lock(regions.mutex);
        regions.regions.erase(reinterpret_cast<std::uintptr_t>(base));
      }
      munmap(base, bytes);
    });
    return Tensor(Device::Cpu, dtype, std::move(shape), static_cast<std::byte*>(memory), std::move(storage));
  }
  void* memory = std::aligned_alloc(kAlignment, bytes);
  require(memory != nullptr, "alloc: out of memory for {} ({} bytes)", describe(probe), bytes);
  std::shared_ptr<void> storage(memory, std::free);
  return Tensor(Device::Cpu, dtype, std::move(shape), static_cast<std::byte*>(memory), std::move(storage));
}

void CpuBackend::fill_zero(Tensor& tensor) {
  const auto begin = reinterpret_cast<std::uintptr_t>(tensor.raw());
  const std::size_t bytes = tensor.nbytes();
  if (bytes >= kMappedBytes && mapped_regions().contains(begin, bytes)) {
    const std::uintptr_t first_page = (begin + kPageBytes - 1) / kPageBytes * kPageBytes;
    const std::uintptr_t end_page = (begin + bytes) / kPageBytes * kPageBytes;
    if (madvise(reinterpret_cast<void*>(first_page), end_page - first_page, MADV_DONTNEED) == 0) {
      std::memset(tensor.raw(), 0, first_page - begin);
      std::memset(reinterpret_cast<void*>(end_page), 0, begin + bytes - end_page);
      return;
    }
  }
  std::memset(tensor.raw(), 0, bytes);
}

Tensor CpuBackend::upload(const void* host, DType dtype, std::vector<int64_t> shape) {
  Tensor tensor = alloc(dtype, std::move(shape));
  std::memcpy(tensor.raw(), host, tensor.nbytes());
  return tensor;
}

void CpuBackend::download(const Tensor& tensor, void* host) { std::memcpy(host, tensor.raw(), tensor.nbytes()); }
void CpuBackend::copy_to(Tensor& tensor, const void* host) { std::memcpy(tensor.raw(), host, tensor.nbytes()); }

Tensor CpuBackend::load_weight(const TensorView& view) {
  Tensor tensor(Device::Cpu, view.dtype, view.shape, const_cast<std::byte*>(view.data), nullptr);
  require(view.data != nullptr, "load_weight: tensor {} has no data", view.name);
  require(tensor.nbytes() <= view.nbytes, "load_weight: tensor {} {} needs {} bytes, the view has {}", view.name,
          shape_string(view.shape), tensor.nbytes(), view.nbytes);
  return tensor;
}

Tensor CpuBackend::random_weight(DType dtype, std::vector<int64_t> shape, uint64_t key, float mean, float stddev) {
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
          "random_weight: dtype {} is not a float storage type (F32, BF16, F16)", dtype_name(dtype));
  Tensor tensor = alloc(dtype, std::move(shape));
  std::byte* data = tensor.raw();
  const std::size_t element = dtype_size(dtype);
  ThreadPool::global().parallel_for(static_cast<std::size_t>(tensor.numel()), [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) store_float(dtype, normal_value(key, i, mean, stddev), data + i * element);
  });
  return tensor;
}

void CpuBackend::place_tokens(const Tensor& source, std::span<const int32_t> pairs, Tensor& tokens) {
  check_place_tokens_args(source, pairs, tokens);
  for (std::size_t j = 0; j < pairs.size(); j += 2)
    tokens.data<int32_t>()[pairs[j]] = source.data<const int32_t>()[pairs[j + 1]];
}

void CpuBackend::embedding(const Tensor& table, const Tensor& tokens, Tensor& out) {
  require_float_weight(table, "embedding", "table");
  require_dtype(tokens, DType::I32, "embedding", "tokens");
  const int64_t rows = tokens.numel(), vocab = table.dim(0), hidden = table.dim(1);
  require_shape(out, {rows, hidden}, "embedding", "out");
  require_dtype(out, DType::F32, "embedding", "out");
  const int32_t* ids = tokens.data<const int32_t>();
  for (int64_t t = 0; t < rows; ++t)
    require(ids[t] >= 0 && ids[t] < vocab, "embedding: token id {} at row {} is outside the vocabulary of {}", ids[t],
            t, vocab);
  for_each_row(rows, hidden, [&](int64_t t) {
    cpu::to_f32(table.raw(), table.dtype(), int64_t{ids[t]} * hidden, hidden, out.data<float>() + t * hidden);
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const int64_t rows = x.dim(0), hidden = x.dim(1);
  require_float_weight(weight, "rms_norm", "weight");
  require_shape(weight, {hidden}, "rms_norm", "weight");
  require_shape(out, x.shape(), "rms_norm", "out");
  for_each_row(rows, hidden, [&](int64_t t) {
    cpu::rms_row(x.data<const float>() + t * hidden, weight, eps, hidden, out.data<float>() + t * hidden);
  });
}

void CpuBackend::add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, float scale) {
  const int64_t rows = residual.dim(0), hidden = residual.dim(1);
  require_float_weight(weight, "add_rms_norm", "weight");
  require_shape(weight, {hidden}, "add_rms_norm", "weight");
  require_shape(y, residual.shape(), "add_rms_norm", "y");
  for_each_row(rows, hidden, [&](int64_t t) {
    add_rms_row(y.data<const float>() + t * hidden, weight, eps, scale, hidden, residual.data<float>() + t * hidden);
  });
}

void CpuBackend::all_reduce_add_rms_norm(std::span<const Tensor> partials, Tensor& residual, const Tensor& weight,
                                         float eps, float scale, const Tensor& next_weight, Tensor& out) {
  const int64_t hidden = check_all_reduce_add_rms_norm_args(partials, residual, weight, next_weight, out);
  require_float_weight(weight, "all_reduce_add_rms_norm", "weight");
  for_each_row(residual.dim(0), hidden, [&](int64_t t) {
    thread_local std::vector<float> sum;
    sum.assign(static_cast<std::size_t>(hidden), 0.0f);
    for (const Tensor& partial : partials) {  // rank order, as every rank of a group sums
      const float* p = partial.data<const float>() + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) sum[static_cast<std::size_t>(i)] += p[i];
    }
    float* row = residual.data<float>() + t * hidden;
    add_rms_row(sum.data(), weight, eps, scale, hidden, row);
    if (out.defined()) cpu::rms_row(row, next_weight, eps, hidden, out.data<float>() + t * hidden);
  });
}

void CpuBackend::linear(const Tensor& x, const LinearTensors& weight, Tensor& y) {
  const cpu::Projection shape = cpu::projection(weight, "linear", "weight");
  const int64_t rows = x.dim(0), out = shape.out, in = shape.in;
  require_shape(x, {rows, in}, "linear", "x");
  require_shape(y, {rows, out}, "linear", "y");
  require_dtype(x, DType::F32, "linear", "x");
  require_dtype(y, DType::F32, "linear", "y");
  cpu::matmul_wt(x.data<const float>(), rows, weight, y.data<float>(), out);
}

void CpuBackend::rope(Tensor& x, const Tensor& positions, int32_t num_heads, int32_t head_dim, float theta) {
  const int64_t rows = x.dim(0);
  require(head_dim % 2 == 0, "rope: head_dim {} is odd", head_dim);
  require_shape(x, {rows, int64_t{num_heads} * head_dim}, "rope", "x");
  require_shape(positions, {rows}, "rope", "positions");
  const int32_t half = head_dim / 2;
  std::vector<double> inverse_frequency(static_cast<std::size_t>(half));
  for (int32_t j = 0; j < half; ++j)
    inverse_frequency[j] = std::pow(static_cast<double>(theta), -2.0 * j / static_cast<double>(head_dim));
  for_each_row(rows, int64_t{num_heads} * head_dim, [&](int64_t t) {
    thread_local std::vector<float> cosines, sines;
    cosines.resize(static_cast<std::size_t>(half));
    sines.resize(static_cast<std::size_t>(half));
    const double position = positions.data<const int32_t>()[t];
    for (int32_t j = 0; j < half; ++j) {
      const double angle = position * inverse_frequency[j];
      cosines[j] = static_cast<float>(std::cos(angle));
      sines[j] = static_cast<float>(std::sin(angle));
    }
    for (int32_t h = 0; h < num_heads; ++h) {
      float* head = x.data<float>() + t * num_heads * head_dim + int64_t{h} * head_dim;
      for (int32_t j = 0; j < half; ++j) {
        const float a = head[j], b = head[j + half];
        head[j] = a * cosines[j] - b * sines[j];
        head[j + half] = b * cosines[j] + a * sines[j];
      }
    }
  });
}

void CpuBackend::ssmax_scale(Tensor& q, const Tensor& positions, float base, float exponent) {
  const int64_t rows = q.dim(0), width = q.numel() / std::max<int64_t>(1, rows);
  require_shape(positions, {rows}, "ssmax_scale", "positions");
  for_each_row(rows, width, [&](int64_t t) {
    const double position = positions.data<const int32_t>()[t];
    const auto factor = static_cast<float>(std::pow(1.0 + position / base, static_cast<double>(exponent)));
    float* row = q.data<float>() + t * width;
    for (int64_t i = 0; i < width; ++i) row[i] *= factor;
  });
}

void CpuBackend::lm_head(const Tensor& x, const Tensor& rows, const Tensor& norm, float eps, const LinearTensors& head,
                         float softcap, Tensor& logits) {
  const cpu::Projection shape = cpu::projection(head, "lm_head", "head");
  require_float_weight(norm, "lm_head", "norm");
  const int64_t tokens = x.dim(0), hidden = x.dim(1), selected = rows.numel(), vocab = shape.out;
  require(shape.in == hidden, "lm_head: head {} has {} input features, x has {}", describe(head.weight), shape.in,
          hidden);
  require_shape(norm, {hidden}, "lm_head", "norm");
  require_dtype(rows, DType::I32, "lm_head", "rows");
  require_shape(logits, {selected, vocab}, "lm_head", "logits");
  std::vector<float> normed(static_cast<std::size_t>(selected * hidden));
  for (int64_t i = 0; i < selected; ++i) {
    const int32_t row = rows.data<const int32_t>()[i];
    require(row >= 0 && row < tokens, "lm_head: row {} is outside the {} rows of x", row, tokens);
    cpu::rms_row(x.data<const float>() + int64_t{row} * hidden, norm, eps, hidden, normed.data() + i * hidden);
  }
  float* out = logits.data<float>();
  cpu::matmul_wt(normed.data(), selected, head, out, vocab);
  if (softcap > 0.0f)
    for_each_row(selected, vocab, [&](int64_t i) {
      float* row = out + i * vocab;
      for (int64_t j = 0; j < vocab; ++j) row[j] = softcap * std::tanh(row[j] / softcap);
    });
}

}  // namespace beamline

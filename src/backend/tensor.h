#pragma once
// A device-neutral tensor: dtype + shape + a buffer that the backend which made it owns (device memory for
// CUDA, host memory for the CPU). Copies share the buffer. Row-major, contiguous, no strides: the ops
// define their layouts by shape alone.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace beamline {

enum class Device : uint8_t { Cpu, Cuda };

class Tensor {
 public:
  Tensor() = default;
  // `storage` keeps `data` alive; it is null for borrowed memory that outlives the tensor by contract
  // (the CPU backend's views of mmap'd weights, kept open by BeamWeights).
  Tensor(Device device, DType dtype, std::vector<int64_t> shape, std::byte* data, std::shared_ptr<void> storage)
      : device_(device), dtype_(dtype), shape_(std::move(shape)), data_(data), storage_(std::move(storage)) {}

  bool defined() const { return data_ != nullptr; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t axis) const { return shape_.at(static_cast<std::size_t>(axis < 0 ? rank() + axis : axis)); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  // Raw pointers: host pointers on the CPU backend, device pointers on CUDA.
  std::byte* raw() const { return data_; }
  template <typename T>
  T* data() const { return reinterpret_cast<T*>(data_); }

  // Same buffer, other shape of equal element count.
  Tensor reshaped(std::vector<int64_t> shape) const;
  // Entry `index` along the first axis: a view into the same buffer, which it keeps alive.
  Tensor slice_first(int64_t index) const;
  // Elements [first, first + count) of the buffer, as `shape` (count = its element count): a view, kept alive.
  Tensor view(int64_t first, std::vector<int64_t> shape) const;

 private:
  Device device_ = Device::Cpu;
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  std::byte* data_ = nullptr;
  std::shared_ptr<void> storage_;
};

std::string describe(const Tensor& tensor);  // "F32[4, 128]"

}  // namespace beamline

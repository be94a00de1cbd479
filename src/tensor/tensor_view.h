#pragma once
// A read-only view of a stored tensor (typically mmap'd checkpoint bytes): no ownership, no copies.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace beamline {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  std::size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
};

// A tensor whose bytes this process holds in memory of its own (weights received from a trainer, docs/rl.md):
// `view` points into `bytes`, which keeps them alive.
struct HostTensor {
  TensorView view;
  std::shared_ptr<const std::vector<std::byte>> bytes;
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[5120, 128]"

}  // namespace beamline

#pragma once
// A read-only view of a stored tensor (typically mmap'd checkpoint bytes): no ownership, no copies.
#include <cstddef>
#include <cstdint>
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

std::string shape_string(const std::vector<int64_t>& shape);  // "[5120, 128]"

}  // namespace beamline

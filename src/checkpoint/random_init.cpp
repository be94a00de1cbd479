#include "checkpoint/random_init.h"

#include <cmath>

#include "util/error.h"

namespace beamline {

RandomInit random_init(const ExpectedTensor& tensor, DType dtype) {
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
          "random weights: dtype {} is not a float storage type (F32, BF16, F16)", dtype_name(dtype));
  const float fan_in_stddev = tensor.shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(tensor.shape[1])) : 1.0f;
  switch (tensor.role) {
    case TensorRole::Embedding:
      return {dtype, 0.0f, 1.0f};
    case TensorRole::Norm:
      return {dtype, 1.0f, 0.1f};
    case TensorRole::Projection:
      return {dtype, 0.0f, fan_in_stddev};
    case TensorRole::Router:
      return {DType::F32, 0.0f, fan_in_stddev};
    case TensorRole::RouterBias:
      return {DType::F32, 0.0f, 0.05f};
  }
  fail("random weights: tensor {} has an unknown role", tensor.name);
}

}  // namespace beamline

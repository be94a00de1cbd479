// The check of every kernel family's variable (kernel_variant.h), once, when the CUDA backend starts.
#include "backend/cuda/common/kernel_variant.h"

#include <string>

#include "util/error.h"

namespace beamline::cuda {

void check_kernel_variants() {
  for (const KernelFamily& family : kKernelFamilies) {
    if (kernel_variant_index(family) >= 0) continue;
    std::string names;
    for (std::size_t i = 0; i < family.count; ++i) names += (i == 0 ? "" : ", ") + std::string(family.names[i]);
    fail("{}={}: expected one of {} (unset: {})", family.variable, kernel_variant(family.variable), names,
         family.names[0]);
  }
}

}  // namespace beamline::cuda

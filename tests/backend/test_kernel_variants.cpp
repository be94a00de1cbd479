// BEAMLINE_CUDA_<FAMILY> (backend/cuda/common/kernel_variant.h): each family's names select its versions, unset selects
// the first, and any other value is refused naming the variable and the names it takes. Host code only: runs without
// a GPU in a CUDA build.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "util/error.h"

#ifdef BEAMLINE_HAVE_CUDA
#include "backend/cuda/common/kernel_variant.h"

namespace beamline {
namespace {

// Sets `variable` for the test's scope, restoring what it was.
class ScopedVariable {
 public:
  ScopedVariable(const char* variable, const char* value) : variable_(variable) {
    if (const char* old = std::getenv(variable)) old_ = old, had_ = true;
    if (value != nullptr)
      ::setenv(variable, value, 1);
    else
      ::unsetenv(variable);
  }
  ~ScopedVariable() {
    if (had_)
      ::setenv(variable_, old_.c_str(), 1);
    else
      ::unsetenv(variable_);
  }

 private:
  const char* variable_;
  std::string old_;
  bool had_ = false;
};

TEST(KernelVariants, NamesSelectTheirIndexAndUnsetTheFirst) {
  for (const cuda::KernelFamily& family : cuda::kKernelFamilies) {
    std::set<std::string_view> distinct(family.names, family.names + family.count);
    EXPECT_EQ(distinct.size(), family.count) << family.variable;
    {
      const ScopedVariable unset(family.variable, nullptr);
      EXPECT_EQ(cuda::kernel_variant_index(family), 0) << family.variable;
      EXPECT_NO_THROW(cuda::check_kernel_variants());
    }
    {
      const ScopedVariable empty(family.variable, "");
      EXPECT_EQ(cuda::kernel_variant_index(family), 0) << family.variable;
    }
    for (std::size_t i = 0; i < family.count; ++i) {
      const ScopedVariable named(family.variable, std::string(family.names[i]).c_str());
      EXPECT_EQ(cuda::kernel_variant_index(family), static_cast<int>(i)) << family.variable;
      EXPECT_NO_THROW(cuda::check_kernel_variants());
    }
  }
}

TEST(KernelVariants, AnotherValueIsRefusedNamingTheVariable) {
  const ScopedVariable splits("BEAMLINE_CUDA_DECODE_SPLITS", "5x");
  EXPECT_EQ(cuda::kernel_variant_index(cuda::kDecodeSplitsFamily), -1);
  try {
    cuda::check_kernel_variants();
    FAIL() << "5x accepted";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "BEAMLINE_CUDA_DECODE_SPLITS=5x: expected one of auto, 2x, 3x, 4x (unset: auto)");
  }
  const ScopedVariable moe("BEAMLINE_CUDA_TOKEN_MOE", "Staged");  // names are exact
  const ScopedVariable fixed("BEAMLINE_CUDA_DECODE_SPLITS", "auto");
  EXPECT_THROW(cuda::check_kernel_variants(), Error);
}

}  // namespace
}  // namespace beamline
#endif

// FusedAllReduceNorm's choices that need no second process: BEAMLINE_FUSED_ALLREDUCE_NORM's values, and that a
// backend without peer memory (the CPU) takes the unfused path without a single collective, so that CPU runs keep
// their numerics and their collectives (the two-process paths: test_peer_all_reduce and bench/gpu_tp_fused.sh).
#include <gtest/gtest.h>

#include <cstdlib>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/registry.h"
#include "parallel/fused_all_reduce_norm.h"
#include "util/error.h"

namespace beamline {
namespace {

// A group of two whose every call fails the test: FusedAllReduceNorm must not communicate on the CPU.
class NoCalls final : public Communicator {
 public:
  int32_t rank() const override { return 0; }
  int32_t size() const override { return 2; }
  const std::string& name() const override { return name_; }
  void all_reduce_sum(Tensor&) override { ADD_FAILURE() << "all_reduce_sum"; }
  void all_gather(const Tensor&, Tensor&) override { ADD_FAILURE() << "all_gather"; }
  void all_gather_columns(const Tensor&, Tensor&) override { ADD_FAILURE() << "all_gather_columns"; }
  void reduce_scatter_sum(const Tensor&, Tensor&) override { ADD_FAILURE() << "reduce_scatter_sum"; }
  void all_to_all(const Tensor&, std::span<const int64_t>, Tensor&, std::span<const int64_t>) override {
    ADD_FAILURE() << "all_to_all";
  }
  void broadcast(Tensor&, int32_t) override { ADD_FAILURE() << "broadcast"; }
  void send(const Tensor&, int32_t) override { ADD_FAILURE() << "send"; }
  void recv(Tensor&, int32_t) override { ADD_FAILURE() << "recv"; }
  void barrier() override { ADD_FAILURE() << "barrier"; }
  void broadcast_bytes(std::vector<std::byte>&, int32_t, bool) override { ADD_FAILURE() << "broadcast_bytes"; }
  int64_t all_reduce_max(int64_t value) override {
    ADD_FAILURE() << "all_reduce_max";
    return value;
  }

 private:
  std::string name_ = "test group";
};

class FusedAllReduceNormTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("BEAMLINE_FUSED_ALLREDUCE_NORM"); }
};

TEST_F(FusedAllReduceNormTest, ModeFromTheEnvironment) {
  unsetenv("BEAMLINE_FUSED_ALLREDUCE_NORM");
  EXPECT_EQ(fused_all_reduce_mode(), FusedAllReduceMode::Never);
  for (const auto& [value, mode] : {std::pair{"", FusedAllReduceMode::Never}, {"auto", FusedAllReduceMode::Auto},
                                    {"always", FusedAllReduceMode::Always}, {"never", FusedAllReduceMode::Never}}) {
    setenv("BEAMLINE_FUSED_ALLREDUCE_NORM", value, 1);
    EXPECT_EQ(fused_all_reduce_mode(), mode) << value;
  }
  setenv("BEAMLINE_FUSED_ALLREDUCE_NORM", "on", 1);
  try {
    fused_all_reduce_mode();
    ADD_FAILURE() << "BEAMLINE_FUSED_ALLREDUCE_NORM=on was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("BEAMLINE_FUSED_ALLREDUCE_NORM=on: expected auto, always or never"),
              std::string::npos)
        << error.what();
  }
}

TEST_F(FusedAllReduceNormTest, CpuBackendTakesTheUnfusedPathWithoutCollectives) {
  std::unique_ptr<Backend> cpu = create_backend("cpu");
  NoCalls group;
  for (const char* mode : {"auto", "always"}) {
    setenv("BEAMLINE_FUSED_ALLREDUCE_NORM", mode, 1);
    FusedAllReduceNorm norm(group, *cpu);
    EXPECT_FALSE(norm.fused(1, 5120)) << mode;
    EXPECT_FALSE(norm.fused(64, 5120)) << mode;
    EXPECT_THROW(norm.partial(1, 5120), Error) << mode;
  }
}

}  // namespace
}  // namespace beamline

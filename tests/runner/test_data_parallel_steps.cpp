// Data-parallel steps on rank 0: the engines of busy replicas are stepped together, idle ones are not waited for, a
// replica that stays away is not waited for past kGatherWait, and a failed step fails every replica in it.
#include <gtest/gtest.h>

#include <thread>

#include "runner/data_parallel_steps.h"
#include "util/error.h"

namespace beamline {
namespace {

ForwardBatch batch_of(int32_t token) {
  ForwardBatch batch;
  batch.tokens = {token};
  return batch;
}

// Records each step's replicas (their batch's token, -1 for none); the outputs are left undefined.
struct Recorder {
  std::mutex mutex;
  std::vector<std::vector<int32_t>> steps;
  DataParallelSteps::RunStep run() {
    return [this](const std::vector<std::optional<ForwardBatch>>& batches) {
      std::vector<int32_t> tokens;
      for (const auto& batch : batches) tokens.push_back(batch ? batch->tokens.front() : -1);
      std::lock_guard lock(mutex);
      steps.push_back(tokens);
      return std::vector<ReplicaStepOutput>(batches.size());
    };
  }
};

TEST(DataParallelSteps, BusyReplicasStepTogether) {
  Recorder recorder;
  DataParallelSteps steps(2, recorder.run());
  // Both replicas become busy (neither calls idle() from here on): replica 0 steps alone (1 is idle), then replica 1
  // waits out kGatherWait for 0's next batch and steps alone.
  steps.launch(0, batch_of(100));
  steps.launch(1, batch_of(200));
  auto engine = [&](int32_t replica) {
    for (int32_t i = 0; i < 5; ++i) steps.launch(replica, batch_of(10 * replica + i));
    steps.idle(replica);
  };
  std::thread a(engine, 0), b(engine, 1);
  a.join();
  b.join();
  ASSERT_EQ(recorder.steps.size(), 7u);  // each waits for the other's batch (unless one came 50 ms late)
  for (std::size_t s = 2; s < recorder.steps.size(); ++s)
    EXPECT_EQ(recorder.steps[s], (std::vector<int32_t>{static_cast<int32_t>(s - 2), 10 + static_cast<int32_t>(s - 2)}));
}

TEST(DataParallelSteps, IdleReplicasAreNotWaitedFor) {
  Recorder recorder;
  DataParallelSteps steps(3, recorder.run());
  const auto start = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < 20; ++i) steps.launch(1, batch_of(i));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(recorder.steps.size(), 20u);
  EXPECT_EQ(recorder.steps.back(), (std::vector<int32_t>{-1, 19, -1}));
  // Waiting for the idle replicas would take kGatherWait per step.
  EXPECT_LT(elapsed, 10 * DataParallelSteps::kGatherWait);
}

TEST(DataParallelSteps, ABusyReplicaThatStaysAwayIsWaitedForAtMostTheGatherWait) {
  Recorder recorder;
  DataParallelSteps steps(2, recorder.run());
  steps.launch(1, batch_of(7));  // replica 1 is busy from here on, and never hands in another batch
  const auto start = std::chrono::steady_clock::now();
  steps.launch(0, batch_of(3));
  EXPECT_GE(std::chrono::steady_clock::now() - start, DataParallelSteps::kGatherWait);
  EXPECT_EQ(recorder.steps.back(), (std::vector<int32_t>{3, -1}));
  steps.idle(1);
  steps.launch(0, batch_of(4));
  EXPECT_EQ(recorder.steps.back(), (std::vector<int32_t>{4, -1}));
}

TEST(DataParallelSteps, AFailedStepFailsItsReplicas) {
  DataParallelSteps steps(2, [](const std::vector<std::optional<ForwardBatch>>&) -> std::vector<ReplicaStepOutput> {
    fail("rank 1: the collective timed out");
  });
  EXPECT_THROW(steps.launch(0, batch_of(1)), Error);
  EXPECT_THROW(steps.launch(1, batch_of(1)), Error);
}

}  // namespace
}  // namespace beamline

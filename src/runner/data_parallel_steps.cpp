#include "runner/data_parallel_steps.h"

#include "util/error.h"

namespace beamline {

DataParallelSteps::DataParallelSteps(int32_t replicas, RunStep run_step)
    : replicas_(replicas), run_step_(std::move(run_step)), idle_(static_cast<std::size_t>(replicas), true) {
  require(replicas >= 1, "data-parallel steps: {} replicas", replicas);
}

bool DataParallelSteps::complete(const Step& step) const {
  for (int32_t r = 0; r < replicas_; ++r) {
    const auto at = static_cast<std::size_t>(r);
    if (!step.batches[at].has_value() && !idle_[at]) return false;
  }
  return true;
}

ReplicaStepOutput DataParallelSteps::launch(int32_t replica, ForwardBatch batch) {
  require(replica >= 0 && replica < replicas_, "data-parallel steps: replica {} of {}", replica, replicas_);
  const auto at = static_cast<std::size_t>(replica);
  std::unique_lock lock(mutex_);
  idle_[at] = false;
  if (gathering_ == nullptr) {
    gathering_ = std::make_shared<Step>();
    gathering_->batches.resize(static_cast<std::size_t>(replicas_));
    gathering_->first_batch = std::chrono::steady_clock::now();
  }
  const std::shared_ptr<Step> step = gathering_;
  require(!step->batches[at].has_value(), "data-parallel steps: replica {} handed in two batches for one step", replica);
  step->batches[at] = std::move(batch);
  changed_.notify_all();
  while (!step->done) {
    const auto deadline = step->first_batch + kGatherWait;
    // Whichever caller finds its step gathered and none running runs it (the others wait for its result).
    if (gathering_ == step && !running_ && (complete(*step) || std::chrono::steady_clock::now() >= deadline)) {
      gathering_ = nullptr;
      running_ = true;
      lock.unlock();
      try {
        step->outputs = run_step_(step->batches);
        require(step->outputs.size() == step->batches.size(), "data-parallel steps: {} outputs for {} replicas",
                step->outputs.size(), step->batches.size());
      } catch (...) {
        step->error = std::current_exception();
      }
      lock.lock();
      running_ = false;
      step->done = true;
      changed_.notify_all();
      break;
    }
    if (gathering_ == step && !running_)
      changed_.wait_until(lock, deadline);
    else
      changed_.wait(lock);
  }
  if (step->error) std::rethrow_exception(step->error);
  return step->outputs[at];
}

void DataParallelSteps::idle(int32_t replica) {
  require(replica >= 0 && replica < replicas_, "data-parallel steps: replica {} of {}", replica, replicas_);
  {
    std::lock_guard lock(mutex_);
    idle_[static_cast<std::size_t>(replica)] = true;
  }
  changed_.notify_all();
}

}  // namespace beamline

#pragma once
// Data-parallel serving on rank 0 (docs/parallel.md): one engine per data-parallel replica, each with its own scheduler
// and KV cache, and one collective step of the distributed model for all of them. Each engine thread hands its
// replica's batch to launch(); the first of them to arrive runs the combined step (every replica's batch, none for an
// idle one) once every replica that is not idle has handed its batch in (or kGatherWait has passed), and each caller
// gets back what the step gave its replica. Stepping the replicas together is what expert parallelism needs (the
// experts see every replica's tokens; a replica without work joins with a dummy step, as vLLM's idle data-parallel
// engines do) and keeps MPI to one thread at a time.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backend/tensor.h"
#include "model/forward_batch.h"

namespace beamline {

// What a combined step gives one replica: the logits of its batch's logit rows, and with routing replay the expert ids
// of its rows (BeamModelRunner::forward's); either undefined when the batch asks for none.
struct ReplicaStepOutput {
  Tensor logits;
  Tensor routed_experts;
};

class DataParallelSteps {
 public:
  // Runs one combined step: a batch or none per replica in, each replica's output out.
  using RunStep =
      std::function<std::vector<ReplicaStepOutput>(const std::vector<std::optional<ForwardBatch>>& batches)>;
  // How long a step waits for a busy replica's batch: an engine between two steps (stop checks, detokenizing,
  // scheduling) hands in its next batch within a millisecond or two; one that is paused with work, or runs a
  // between-steps task, is not waited for longer than this.
  static constexpr std::chrono::milliseconds kGatherWait{50};

  DataParallelSteps(int32_t replicas, RunStep run_step);

  // On `replica`'s engine thread: returns when the step holding `batch` has run, with that replica's output; rethrows
  // what the step threw.
  ReplicaStepOutput launch(int32_t replica, ForwardBatch batch);
  // `replica`'s engine waits for new work: steps no longer wait for its batch (until its next launch).
  void idle(int32_t replica);

 private:
  struct Step {
    std::vector<std::optional<ForwardBatch>> batches;
    std::chrono::steady_clock::time_point first_batch;
    std::vector<ReplicaStepOutput> outputs;
    std::exception_ptr error;
    bool done = false;
  };
  // Under mutex_: every replica has handed in its batch or is idle.
  bool complete(const Step& step) const;

  const int32_t replicas_;
  RunStep run_step_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<bool> idle_;          // every replica starts idle
  std::shared_ptr<Step> gathering_;  // the step that batches go to now; null until the first
  bool running_ = false;             // a step runs (on one of the callers' threads)
};

}  // namespace beamline

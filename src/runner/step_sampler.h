#pragma once
// The sampling half of a runner's steps (ModelRunner's ModelStep) on any backend, so that every runner samples the
// same way: rows the backend can take go through Backend::sample, and only their tokens and requested logprobs come
// back, into host buffers the step waits for later; a host row's raw logits come back alone and go to its
// sample_on_host. The tokens of the latest step sampled wholly on the device stay there for the next step's deferred
// tokens (--async-scheduling).
#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "engine/model_runner.h"

namespace beamline {

class StepSampler {
 public:
  // `backend` holds the logits; it and this sampler must outlive every step handed out.
  StepSampler(Backend& backend, int32_t vocab_size);

  // The step just launched, which samples `logits` (F32 [num_logit_rows, vocab_size] on the backend, undefined when
  // num_logit_rows is 0). Throws Error when the logits have another shape.
  std::unique_ptr<ModelStep> step(Tensor logits, std::size_t num_logit_rows);
  // For the step about to launch: the tokens (I32 on the backend) that the last step handed out sampled, in the order
  // of its rows, when every row was sampled on the device. Throws Error when it was not sampled that way (yet).
  const Tensor& deferred_source() const;

 private:
  class Step;

  Backend& backend_;
  int32_t vocab_size_;
  int64_t steps_ = 0;              // handed out
  int64_t sampled_step_ = 0;       // the latest of them whose rows were all sampled on the device (1-based; 0: none)
  Tensor sampled_tokens_;          // its tokens
};

}  // namespace beamline

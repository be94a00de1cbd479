// CpuBackend::sample: sampling/sampling.h's sample_row over the rows, in parallel (each row is independent); and
// mask_logits, the structured-output token masks applied before it.
#include <algorithm>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {

void CpuBackend::sample(const Tensor& logits, std::span<const SampleRow> rows, SampleOutputs& out) {
  require(logits.device() == Device::Cpu, "sample: logits are not a CPU tensor");
  const int32_t max_logprobs = check_sample_args(logits, rows, out);
  const auto vocab = static_cast<std::size_t>(logits.dim(1));
  const int64_t width = max_logprobs >= 0 ? out.top_ids.dim(1) : 0;
  ThreadPool::global().parallel_for(
      rows.size(),
      [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          const std::span<const float> raw(logits.data<const float>() + rows[i].logit_row * vocab, vocab);
          const SampledToken sampled = sample_row(raw, raw, rows[i]);
          out.tokens.data<int32_t>()[i] = sampled.token;
          if (!sampled.logprob) continue;
          out.logprobs.data<float>()[i] = sampled.logprob->logprob;
          out.ranks.data<int32_t>()[i] = sampled.logprob->rank;
          for (std::size_t j = 0; j < sampled.logprob->top.size(); ++j) {
            out.top_ids.data<int32_t>()[static_cast<int64_t>(i) * width + static_cast<int64_t>(j)] =
                sampled.logprob->top[j].first;
            out.top_logprobs.data<float>()[static_cast<int64_t>(i) * width + static_cast<int64_t>(j)] =
                sampled.logprob->top[j].second;
          }
        }
      },
      std::max<std::size_t>(1, 65536 / vocab));
}

void CpuBackend::mask_logits(Tensor& logits, std::span<const int32_t> rows, const Tensor& allowed) {
  require(logits.device() == Device::Cpu && allowed.device() == Device::Cpu, "mask_logits: inputs are not CPU tensors");
  check_mask_logits_args(logits, rows, allowed);
  const int64_t vocab = logits.dim(1), words = allowed.dim(1);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    float* row = logits.data<float>() + rows[i] * vocab;
    const auto* bits = reinterpret_cast<const uint32_t*>(allowed.data<const int32_t>()) + static_cast<int64_t>(i) * words;
    for (int64_t t = 0; t < vocab; ++t)
      if (((bits[t >> 5] >> (t & 31)) & 1u) == 0) row[t] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace beamline

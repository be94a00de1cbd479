// CpuBackend::sample: sampling/sampling.h's sample_row over the rows, in parallel (each row is independent).
#include <algorithm>

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

}  // namespace beamline

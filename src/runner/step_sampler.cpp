#include "runner/step_sampler.h"

#include <algorithm>
#include <span>
#include <vector>

#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {
namespace {

// `copy(index, first_row, count)` for each run of consecutive logit rows in `rows` (a prompt's, a draft's verified
// rows), so that each run crosses to the host in one copy.
template <typename Copy>
void for_each_run(std::span<const int32_t> rows, Copy copy) {
  for (std::size_t r = 0; r < rows.size();) {
    std::size_t run = 1;
    while (r + run < rows.size() && rows[r + run] == rows[r] + static_cast<int32_t>(run)) ++run;
    copy(r, rows[r], run);
    r += run;
  }
}

}  // namespace

class StepSampler::Step final : public ModelStep {
 public:
  Step(StepSampler& sampler, int64_t number, Tensor logits)
      : sampler_(sampler), number_(number), logits_(std::move(logits)) {}

  void sample(std::vector<RowSampling> rows) override;
  std::vector<SampledToken> tokens() override;
  std::vector<float> raw_logits(std::span<const int32_t> rows) override;

 private:
  void apply_token_masks(const std::vector<RowSampling>& rows);
  void enqueue_on_device();
  void sample_on_host(const std::vector<RowSampling>& rows, const std::vector<std::size_t>& on_host);

  StepSampler& sampler_;
  const int64_t number_;
  const Tensor logits_;
  bool sampled_ = false;
  std::vector<SampledToken> results_;      // one per row; the host rows' filled by sample()
  std::vector<std::size_t> device_rows_;   // which rows Backend::sample takes
  std::vector<SampleRow> device_settings_; // theirs, in that order
  int64_t width_ = 1;                      // of the top-logprob outputs
  std::vector<int32_t> tokens_, ranks_, top_ids_;
  std::vector<float> logprobs_, top_logprobs_;
  std::vector<std::unique_ptr<PendingDownload>> downloads_;
};

void StepSampler::Step::sample(std::vector<RowSampling> rows) {
  require(!sampled_, "step {}: its rows were sampled already", number_);
  sampled_ = true;
  const int64_t num_logit_rows = logits_.defined() ? logits_.dim(0) : 0;
  results_.resize(rows.size());
  std::vector<std::size_t> on_host;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    SampleRow settings = rows[r].settings;
    require(settings.logit_row >= 0 && settings.logit_row < num_logit_rows,
            "step sampling: row {} reads logit row {} of {}", r, settings.logit_row, num_logit_rows);
    if (rows[r].sample_on_host) {
      on_host.push_back(r);
      continue;
    }
    settings.num_logprobs = std::min(settings.num_logprobs, sampler_.vocab_size_);
    device_rows_.push_back(r);
    device_settings_.push_back(settings);
  }
  apply_token_masks(rows);
  if (!device_rows_.empty()) enqueue_on_device();
  if (!on_host.empty()) sample_on_host(rows, on_host);
}

void StepSampler::Step::apply_token_masks(const std::vector<RowSampling>& rows) {
  const auto words = static_cast<std::size_t>((sampler_.vocab_size_ + 31) / 32);
  std::vector<int32_t> masked_rows;
  std::vector<uint32_t> allowed;
  // Sized once: at batch 64 on a 201K-token vocabulary the masks are 1.6 MB, and growing the buffer copies them again.
  allowed.reserve(words * static_cast<std::size_t>(std::count_if(
                              rows.begin(), rows.end(), [](const RowSampling& row) { return !row.allowed_tokens.empty(); })));
  for (const RowSampling& row : rows) {
    if (row.allowed_tokens.empty()) continue;
    require(row.allowed_tokens.size() == words, "step sampling: a token mask of {} words for {} tokens",
            row.allowed_tokens.size(), sampler_.vocab_size_);
    masked_rows.push_back(row.settings.logit_row);
    allowed.insert(allowed.end(), row.allowed_tokens.begin(), row.allowed_tokens.end());
  }
  if (masked_rows.empty()) return;
  // One upload for all the masks; the logits are edited in place (this step is their only reader).
  Backend& backend = sampler_.backend_;
  const Tensor device_allowed = backend.upload(allowed.data(), DType::I32,
                                               {static_cast<int64_t>(masked_rows.size()), static_cast<int64_t>(words)});
  Tensor logits = logits_;
  backend.mask_logits(logits, masked_rows, device_allowed);
}

void StepSampler::Step::enqueue_on_device() {
  Backend& backend = sampler_.backend_;
  int32_t max_logprobs = -1;
  for (const SampleRow& row : device_settings_) max_logprobs = std::max(max_logprobs, row.num_logprobs);
  const auto count = static_cast<int64_t>(device_settings_.size());
  width_ = std::max(1, max_logprobs);
  SampleOutputs out;
  out.tokens = backend.alloc(DType::I32, {count});
  if (max_logprobs >= 0) {
    out.logprobs = backend.alloc(DType::F32, {count});
    out.ranks = backend.alloc(DType::I32, {count});
    out.top_ids = backend.alloc(DType::I32, {count, width_});
    out.top_logprobs = backend.alloc(DType::F32, {count, width_});
  }
  backend.sample(logits_, device_settings_, out);
  auto read_back = [&](const Tensor& tensor, auto& host) {
    host.resize(static_cast<std::size_t>(tensor.numel()));
    downloads_.push_back(backend.download_later(tensor, host.data()));
  };
  read_back(out.tokens, tokens_);
  if (max_logprobs >= 0) {
    read_back(out.logprobs, logprobs_);
    read_back(out.ranks, ranks_);
    read_back(out.top_ids, top_ids_);
    read_back(out.top_logprobs, top_logprobs_);
  }
  // Only a step sampled wholly here has its tokens in row order, which is what the next step's deferred tokens name.
  if (device_rows_.size() == results_.size()) {
    sampler_.sampled_step_ = number_;
    sampler_.sampled_tokens_ = out.tokens;
  }
}

void StepSampler::Step::sample_on_host(const std::vector<RowSampling>& rows, const std::vector<std::size_t>& on_host) {
  Backend& backend = sampler_.backend_;
  // Only these rows cross to the host: a run of consecutive logit rows (a draft's verified rows) in one copy, and one
  // wait for all the copies rather than one per row.
  const auto vocab = static_cast<std::size_t>(sampler_.vocab_size_);
  std::vector<float> logits(on_host.size() * vocab);
  std::vector<int32_t> logit_rows;
  for (const std::size_t r : on_host) logit_rows.push_back(rows[r].settings.logit_row);
  std::vector<std::unique_ptr<PendingDownload>> copies;
  for_each_run(logit_rows, [&](std::size_t h, int32_t first, std::size_t count) {
    const Tensor block = logits_.view(static_cast<int64_t>(first) * static_cast<int64_t>(vocab),
                                      {static_cast<int64_t>(count), static_cast<int64_t>(vocab)});
    copies.push_back(backend.download_later(block, logits.data() + h * vocab));
  });
  for (const std::unique_ptr<PendingDownload>& copy : copies) copy->wait();
  // Each row touches only its own sample's state (RowSampling's contract), so the rows can be sampled in parallel.
  ThreadPool::global().parallel_for(
      on_host.size(),
      [&](std::size_t begin, std::size_t end) {
        for (std::size_t h = begin; h < end; ++h) {
          const std::span<const float> row(logits.data() + h * vocab, vocab);
          results_[on_host[h]] = rows[on_host[h]].sample_on_host(row);
        }
      },
      std::max<std::size_t>(1, 65536 / vocab));
}

std::vector<SampledToken> StepSampler::Step::tokens() {
  for (const std::unique_ptr<PendingDownload>& download : downloads_) download->wait();
  for (std::size_t d = 0; d < device_rows_.size(); ++d) {
    SampledToken& result = results_[device_rows_[d]];
    result.token = tokens_[d];
    const int32_t wanted = device_settings_[d].num_logprobs;
    if (wanted < 0) continue;
    TokenLogprob& logprob = result.logprob.emplace();
    logprob.token = result.token;
    logprob.logprob = logprobs_[d];
    logprob.rank = ranks_[d];
    for (int32_t j = 0; j < wanted; ++j) {
      const auto at = static_cast<std::size_t>(static_cast<int64_t>(d) * width_ + j);
      logprob.top.emplace_back(top_ids_[at], top_logprobs_[at]);
    }
  }
  return std::move(results_);
}

std::vector<float> StepSampler::Step::raw_logits(std::span<const int32_t> rows) {
  const int64_t num_logit_rows = logits_.defined() ? logits_.dim(0) : 0;
  const auto vocab = static_cast<std::size_t>(sampler_.vocab_size_);
  std::vector<float> host(rows.size() * vocab);
  for (const int32_t row : rows)
    require(row >= 0 && row < num_logit_rows, "step logits: row {} of {}", row, num_logit_rows);
  for_each_run(rows, [&](std::size_t r, int32_t first, std::size_t count) {
    const Tensor block = logits_.view(static_cast<int64_t>(first) * static_cast<int64_t>(vocab),
                                      {static_cast<int64_t>(count), static_cast<int64_t>(vocab)});
    sampler_.backend_.download(block, host.data() + r * vocab);
  });
  return host;
}

StepSampler::StepSampler(Backend& backend, int32_t vocab_size) : backend_(backend), vocab_size_(vocab_size) {}

std::unique_ptr<ModelStep> StepSampler::step(Tensor logits, std::size_t num_logit_rows) {
  if (num_logit_rows > 0) {
    const auto rows = static_cast<int64_t>(num_logit_rows);
    require(logits.rank() == 2 && logits.dim(0) == rows && logits.dim(1) == vocab_size_,
            "the model returned logits {} for {} rows of {} tokens", describe(logits), num_logit_rows, vocab_size_);
  }
  return std::make_unique<Step>(*this, ++steps_, std::move(logits));
}

const Tensor& StepSampler::deferred_source() const {
  require(steps_ > 0 && sampled_step_ == steps_,
          "deferred tokens read the samples of the step launched before, which did not sample all its rows on the device");
  return sampled_tokens_;
}

}  // namespace beamline

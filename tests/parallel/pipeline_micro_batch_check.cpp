// Run under mpirun (tests/parallel/CMakeLists.txt): pipeline micro-batches. A batch of several sequences (a prefill of
// different lengths, then decode steps) through a random MoE model split into --pp stages, its sequences in
// micro-batches that follow each other through the stages, gives on the CPU backend the logits of the whole model on
// one rank (max |difference| <= 1e-5 x max |logit|). With --time R it also times R rounds of the same steps with one
// micro-batch per stage against none (ParallelConfig::pipeline_micro_batches 1), on the preset given: the prefill
// differs, the decode steps (too few rows to split) do not.
//   pipeline_micro_batch_check --pp N [--tp N] [--sequences S] [--micro-batches M] [--preset tiny|small] [--time R]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/presets.h"
#include "checkpoint/shard_weights.h"
#include "model/beam_model.h"
#include "mpi_check.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_groups.h"
#include "runner/kv_cache.h"
#include "util/error.h"

namespace beamline {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int32_t kBlockSize = 8;  // divides the sliding windows of tiny (8) and small (64)
constexpr int32_t kDecodeSteps = 3;

struct Options {
  ParallelConfig parallel;
  int32_t sequences = 6;
  std::string preset = "tiny";
  int32_t rounds = 0;  // --time
};

Options parse(int argc, char** argv) {
  Options options;
  int32_t micro_batches = 0;
  options.parallel = parse_check_args(argc, argv, 120, [&](const std::string& flag, const auto& value) {
    if (flag == "--sequences") options.sequences = flag_int(flag, value());
    else if (flag == "--micro-batches") micro_batches = flag_int(flag, value());
    else if (flag == "--preset") options.preset = value();
    else if (flag == "--time") options.rounds = flag_int(flag, value());
    else return false;
    return true;
  });
  options.parallel.pipeline_micro_batches = micro_batches;
  return options;
}

// Sequence s has 64 + 16 s prompt tokens (different lengths, so the micro-batches' row shares differ from their
// sequence counts; enough rows for BeamModel::kMinMicroBatchRows each) and owns blocks of its own in every KV group.
class Steps {
 public:
  Steps(int32_t sequences, int64_t vocab, int32_t groups) : sequences_(sequences), groups_(groups) {
    uint32_t state = 12345u;
    for (int32_t s = 0; s < sequences; ++s) {
      std::vector<int32_t> tokens;
      for (int32_t i = 0; i < prompt_length(s) + kDecodeSteps; ++i) {
        state = state * 1664525u + 1013904223u;
        tokens.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(vocab)));
      }
      tokens_.push_back(std::move(tokens));
    }
  }
  static int32_t prompt_length(int32_t s) { return 64 + 16 * s; }
  int32_t blocks_per_sequence() const { return (prompt_length(sequences_ - 1) + kDecodeSteps) / kBlockSize + 1; }
  int32_t num_blocks() const { return groups_ * sequences_ * blocks_per_sequence(); }

  // Step 0: every prompt, the logits of every row; step k > 0: one decode token per sequence.
  ForwardBatch batch(int32_t step) const {
    ForwardBatch batch;
    for (int32_t s = 0; s < sequences_; ++s) {
      const int32_t begin = step == 0 ? 0 : prompt_length(s) + step - 1;
      const int32_t end = step == 0 ? prompt_length(s) : begin + 1;
      SequenceSlice slice;
      slice.token_begin = static_cast<int32_t>(batch.tokens.size());
      slice.context_begin = begin;
      const auto& tokens = tokens_[static_cast<std::size_t>(s)];
      batch.tokens.insert(batch.tokens.end(), tokens.begin() + begin, tokens.begin() + end);
      slice.token_end = static_cast<int32_t>(batch.tokens.size());
      for (int32_t g = 0; g < groups_; ++g) {  // KV groups share the pool's blocks: each its own
        std::vector<int32_t> table;
        for (int32_t b = 0; b < blocks_per_sequence(); ++b)
          table.push_back((g * sequences_ + s) * blocks_per_sequence() + b);
        slice.block_tables.push_back(std::move(table));
      }
      for (int32_t row = slice.token_begin; row < slice.token_end; ++row) batch.logit_rows.push_back(row);
      batch.sequences.push_back(std::move(slice));
    }
    return batch;
  }

 private:
  int32_t sequences_, groups_;
  std::vector<std::vector<int32_t>> tokens_;
};

// Every step's logits (on the first stage), end to end.
std::vector<float> run_steps(BeamModel& model, Backend& backend, const Steps& steps) {
  const ModelConfig& config = model.config();
  KvCache cache(backend, config, make_kv_cache_layout(config, kBlockSize, steps.num_blocks()));
  std::vector<float> logits;
  for (int32_t step = 0; step <= kDecodeSteps; ++step) {
    const Tensor out = model.forward(steps.batch(step), cache);
    if (!out.defined()) continue;
    const std::vector<float> part = backend.download_f32(out);
    logits.insert(logits.end(), part.begin(), part.end());
  }
  return logits;
}

// Milliseconds per round of the steps (prefill and decodes), the best of `rounds` after one warm-up.
double time_rounds(BeamModel& model, Backend& backend, const Steps& steps, ParallelGroups& groups, int32_t rounds) {
  double best = 1e300;
  for (int32_t r = 0; r <= rounds; ++r) {
    groups.world->barrier();
    const auto start = std::chrono::steady_clock::now();
    run_steps(model, backend, steps);
    groups.world->barrier();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

int check(int argc, char** argv) {
  Options options = parse(argc, argv);
  MpiWorld world(options.parallel.timeout_seconds);
  std::unique_ptr<Backend> whole_backend = create_backend("cpu"), shard_backend = create_backend("cpu");
  std::unique_ptr<ParallelGroups> groups = make_parallel_groups(world, options.parallel, *shard_backend);
  const ModelConfig config = preset_config(options.preset);
  const BeamWeights weights = dummy_weights(config, 11, DType::F32);
  const ModelShard shard = model_shard(config, options.parallel, groups->at);
  BeamModel sharded(shard_weights(weights, shard), *shard_backend, shard, groups.get());
  const Steps steps(options.sequences, config.vocab_size,
                    make_kv_cache_layout(config, kBlockSize, 1).num_groups());

  // The split the stages use for the prefill: more than one micro-batch, or the test tests nothing.
  const int32_t micro_batches = options.parallel.micro_batches();
  // The prefill splits into micro-batches (or this tests nothing); a decode step of a few rows does not.
  const std::size_t prefill_parts = sharded.micro_batch_bounds(steps.batch(0)).size() - 1;
  require(prefill_parts == static_cast<std::size_t>(micro_batches), "the prefill splits into {} micro-batches, not {}",
          prefill_parts, micro_batches);
  require(sharded.micro_batch_bounds(steps.batch(1)).size() == 2, "a decode step of {} rows splits into micro-batches",
          options.sequences);
  if (options.rounds == 0) {
    BeamModel whole(weights, *whole_backend);
    const std::vector<float> expected = run_steps(whole, *whole_backend, steps);
    const std::vector<float> actual = run_steps(sharded, *shard_backend, steps);
    if (!groups->first_stage()) return 0;
    const LogitsDifference difference = logits_difference(actual, expected, fmt::format("rank {}", world.rank()));
    spdlog::info("rank {}: {} sequences in {} micro-batches over {} stages: {} logits, max |difference| {:.3g} of max "
                 "|logit| {:.3g}",
                 world.rank(), options.sequences, micro_batches, options.parallel.pipeline, actual.size(),
                 difference.worst, difference.scale);
    require(difference.within(kTolerance), "rank {}: relative difference {:.3g} exceeds {:.0e}", world.rank(),
            difference.relative(), kTolerance);
    return 0;
  }
  const double overlapped = time_rounds(sharded, *shard_backend, steps, *groups, options.rounds);
  groups->config.pipeline_micro_batches = 1;
  const double one_batch = time_rounds(sharded, *shard_backend, steps, *groups, options.rounds);
  if (world.rank() == 0)
    spdlog::info("{} over {} stages x {} tensor ranks, {} sequences (a prefill of {} rows and {} decode steps): {:.1f} ms "
                 "per round with {} micro-batches, {:.1f} ms with one ({:+.1f}%)",
                 options.preset, options.parallel.pipeline, options.parallel.tensor, options.sequences,
                 steps.batch(0).tokens.size(), kDecodeSteps, overlapped, micro_batches, one_batch,
                 100.0 * (overlapped - one_batch) / one_batch);
  return 0;
}

}  // namespace
}  // namespace beamline

int main(int argc, char** argv) { return beamline::run_check(beamline::check, argc, argv); }

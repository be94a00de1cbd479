#pragma once
// Adaptive verification: how many draft tokens each decoding sequence verifies in a step (k_i <= K), chosen to
// maximise the step's expected output tokens per second (goodput, as SmartSpec, Liu et al. 2024), so that speculation
// helps where it pays and costs nothing where it does not (a large batch whose verify rows cost more than they win).
//
// - Expected tokens: a sequence verifying k drafts emits 1 + sum_{j<=k} prod_{m<=j} a_m tokens, a_m the chance that
//   draft m is accepted once drafts 1..m-1 were. a_m comes from the drafter's confidence in draft m (its softmax
//   probability of the token it proposed), calibrated online: per confidence bin, the rate at which such drafts were
//   accepted, starting from the confidence itself. Without a confidence (n-gram drafts, or before the drafter has run
//   in a step) a_m is the running acceptance rate of position m. Counts decay (half-life ~700 verifications), so the
//   estimates follow the workload.
// - Step cost: the wall time of whole engine steps, measured online (nothing has to be profiled first, and it counts
//   everything a drafted step costs: the drafter pass, its downloads, the verify rows, the host's verification, the
//   context-feature commit), in a table by decoding sequences (power-of-two buckets) and drafted tokens per decoding
//   sequence ceil(n / D) in 0..K; 0 is a plain step (no drafter pass, recorded decode graphs on a GPU). Unmeasured
//   entries are interpolated linearly between measured neighbours (0 and K first, then what the choice explores).
//   Steps that carry prompt rows have a table of their own: on a runner with decode graphs they run op by op whether
//   they draft or not (several times a replayed step's host time), so a plain step is cheap only without them. One
//   table for both priced every plain step at its replayed cost: on the H200 at batch 64 the choice took 32 plain
//   steps of 8.4 ms (op by op, prompt rows) for 12.6 tokens each, where fixed K drafted
//   (bench/results/2026-12-03-spec15.md). The engine says which table applies (Scheduler::next_step_has_prompt_rows).
//   A sample is clipped at twice the entry's estimate (graph recordings, stalls), and entries are exponential moving
//   averages.
// - The choice: the marginal gains prod_{m<=j} a_m are non-increasing in j, so the best n drafts of the batch are the
//   n largest gains; every n from 0 to the drafts on offer is scored (D + gains) / cost(D, ceil(n / D)) and the best
//   taken. Uniform (a runner that replays decode graphs): every sequence verifies the same k (or all it has, when
//   fewer), each k in 0..K scored (D + the gains of each sequence's first k) / cost(D, k), because a verify step whose
//   sequences carry drafts of different lengths cannot replay a graph and runs op by op: on the H200 at batch 64 the
//   per-sequence allocation verified 6.2 drafts per sequence where fixed K verified 7 and was 21% slower
//   (bench/results/2026-12-03-specblock.md); a step with prompt rows runs op by op anyway, so there each sequence
//   gets its own count. Before the drafter runs, the same rule with position rates decides whether the step drafts at
//   all: a plain step skips the drafter pass and runs as without speculation.
// - Full drafts first: another plan (fewer drafts, or none) is taken only when its expected rate beats verifying
//   every draft on offer by kFullDraftMargin, so that estimates within their noise of each other never make adaptive
//   verification slower than fixed K (on the H200 at batch 64 it was 24% slower: bench/results/2026-12-03-spec15.md).
// - Exploration: a bucket measures full-K drafted steps and plain steps first (two each: the first sample of an entry
//   is replaced by the second), then the losing kind is measured again after 16 steps, the interval doubling (to 1024)
//   each time it still loses, so stale estimates cannot lock a choice in and re-measuring costs a vanishing share of
//   steps.
// Outputs do not depend on any of this: the target verifies whatever is drafted (greedy outputs are token for token
// those without speculation); only speed does.
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace beamline {

class AdaptiveVerification {
 public:
  // `uniform`: every sequence verifies the same number of drafts (the class comment).
  explicit AdaptiveVerification(int32_t max_draft_tokens, bool uniform = false);

  // What a decoding sequence may verify: up to `room` drafts; `confidence` (one per proposed draft token, in [0, 1])
  // when the drafter gave one, else empty (position rates are used).
  struct Candidate {
    int32_t room = 0;
    std::span<const float> confidence;
  };
  // Before proposing: whether the step should draft (run the drafter pass / look up n-grams) for `decoding` one-token
  // sequences, the candidates among them having no confidences yet.
  // `prompt_rows`: the step will also carry prompt rows (priced from their own table).
  bool should_draft(int32_t decoding, std::span<const Candidate> candidates, bool prompt_rows = false);
  // After proposing: how many of its drafts each candidate verifies (<= room, <= its confidences when given). With
  // `drafted` (the drafter pass has run) at least one token is verified when any is on offer.
  std::vector<int32_t> choose(int32_t decoding, std::span<const Candidate> candidates, bool drafted,
                              bool prompt_rows = false);

  // A draft of `verified` tokens (their confidences, or empty) of which the first `accepted` were accepted.
  void record_verification(std::span<const float> confidence, int32_t verified, int32_t accepted);
  // A step of `decoding` decoding sequences (and prompt rows besides when `prompt_rows`), `draft_tokens` drafts
  // verified, `drafter_ran`: a drafter pass or lookup ran for it; `seconds` its wall time. Drafted steps with no draft
  // left are not measured (neither kind).
  void record_step(int32_t decoding, int32_t draft_tokens, bool drafter_ran, double seconds, bool prompt_rows = false);

  // Estimates, for tests and logs.
  double acceptance(int32_t position, std::optional<float> confidence) const;
  std::optional<double> step_seconds(int32_t decoding, int32_t drafts_per_sequence, bool prompt_rows = false) const;

  static constexpr int32_t kConfidenceBins = 10;
  static constexpr int32_t kFirstExploreInterval = 16, kMaxExploreInterval = 1024;
  static constexpr double kFullDraftMargin = 0.05;

 private:
  struct Rate {
    double accepted = 0, reached = 0;
  };
  struct Cost {
    double seconds = 0;
    int32_t samples = 0;
  };
  struct Bucket {
    std::vector<Cost> cost;  // [0..K]: by drafted tokens per decoding sequence, 0 = plain
    int64_t steps = 0;       // decisions taken at this bucket
    int64_t plain_measured_at = 0, drafted_measured_at = 0;  // `steps` when each kind was last run
    int64_t interval = kFirstExploreInterval;
    bool last_drafted = true;
  };

  static int32_t bucket_index(int32_t decoding);
  Bucket& bucket(int32_t decoding, bool prompt_rows);
  const Bucket* find_bucket(int32_t decoding, bool prompt_rows) const;
  static bool known(const Cost& cost) { return cost.samples >= 2; }
  // Cost of a step with `per_sequence` drafts per decoding sequence; nullopt when nothing around it is measured.
  std::optional<double> estimate(const Bucket& bucket, int32_t per_sequence) const;
  // The best number of drafts n in [min_n, gains.size()] (gains sorted, largest first) and its expected tokens per
  // second; nullopt when a cost it needs is unmeasured.
  std::optional<std::pair<int32_t, double>> best(const Bucket& bucket, int32_t decoding, std::span<const double> gains,
                                                 int32_t min_n) const;
  // Uniform: the best k in [min_k, K] (each candidate verifying min(k, its gains)) and its expected tokens per second.
  std::optional<std::pair<int32_t, double>> best_uniform(const Bucket& bucket, int32_t decoding,
                                                         const std::vector<std::vector<double>>& per_candidate,
                                                         int32_t min_k) const;
  std::vector<double> gains(std::span<const Candidate> candidates, std::vector<std::vector<double>>* per_candidate) const;
  static void decay_and_add(Rate& rate, bool accepted);

  int32_t max_draft_tokens_;
  bool uniform_;
  std::vector<Rate> by_position_;    // [K]: conditional acceptance of draft position j
  std::vector<Rate> by_confidence_;  // [kConfidenceBins]
  std::array<std::vector<Bucket>, 2> buckets_;  // [prompt_rows]: steps without prompt rows, steps with them
};

}  // namespace beamline

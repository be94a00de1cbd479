// Sampling in both modes. Test: Backend::sample against the reference over LM-like logits (ties, NaNs) at four
// vocabulary sizes and 1-64 logit rows in eight filter modes with logprob requests, and rows that reach the device's
// less common selection paths; a token that differs is accepted only where the reference's own decision was fragile
// under float summation order. Perf (`perf sample`): Backend::sample on the CUDA backend over random FP32 logits of
// a preset's vocabulary (normal, stddev 4, as the test mode draws them), per row count and filter mode, each call as
// the decode loop makes it (the row parameters uploaded, then the sampling kernels); prints a Markdown table next to
// the HBM floor (every sampled row read once, / 4.8 TB/s, PERF.md).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/presets.h"
#include "harness.h"
#include "op_families.h"
#include "perf.h"
#include "sampling/sampling.h"

namespace beamline::backend_ops {
namespace {

// Where the reference's decision for one row is fragile under float summation order, each as a fraction of the
// kept mass: the uniform's distance from its token's CDF edges, from the device token's CDF interval (0 inside it;
// infinite for a token the reference did not keep), and the top_p target's from the nucleus edge.
struct SampleMargins {
  double draw = 1.0, device_draw = std::numeric_limits<double>::infinity(), nucleus = 1.0;
  std::vector<int32_t> kept_before_top_p;  // token ids, ascending
};

SampleMargins sample_margins(std::vector<float> row, const SampleRow& settings, int32_t token, int32_t device) {
  SampleMargins margins;
  for (float& l : row)
    if (std::isnan(l)) l = -std::numeric_limits<float>::infinity();
  apply_temperature(row, settings.temperature);
  apply_min_p(row, settings.min_p);
  apply_top_k(row, settings.top_k);
  const float best = *std::max_element(row.begin(), row.end());
  if (best == -std::numeric_limits<float>::infinity()) return margins;
  auto weight = [&](float l) {
    return l == -std::numeric_limits<float>::infinity() ? 0.0 : std::exp(static_cast<double>(l - best));
  };
  for (std::size_t t = 0; t < row.size(); ++t)
    if (weight(row[t]) > 0.0) margins.kept_before_top_p.push_back(static_cast<int32_t>(t));
  if (settings.top_p < 1.0f) {
    double total = 0.0;
    for (float l : row) total += weight(l);
    std::vector<int32_t> order = margins.kept_before_top_p;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const double target = settings.top_p * total;
    double cumulative = 0.0;
    for (int32_t t : order) {
      if (cumulative >= target) break;
      cumulative += weight(row[t]);
      margins.nucleus = std::min(margins.nucleus, std::abs(cumulative - target) / total);
    }
    apply_top_p(row, settings.top_p);
  }
  double total = 0.0, before = 0.0, device_before = 0.0;
  for (std::size_t t = 0; t < row.size(); ++t) {
    total += weight(row[t]);
    if (static_cast<int32_t>(t) < token) before += weight(row[t]);
    if (static_cast<int32_t>(t) < device) device_before += weight(row[t]);
  }
  const double after = before + weight(row[static_cast<std::size_t>(token)]);
  margins.draw = std::min(std::abs(settings.uniform - before / total), std::abs(after / total - settings.uniform));
  const double device_weight = weight(row[static_cast<std::size_t>(device)]);
  if (device_weight > 0.0)
    margins.device_draw = std::max({0.0, device_before / total - settings.uniform,
                                    settings.uniform - (device_before + device_weight) / total});
  return margins;
}

// A token that differs from the reference's is accepted only where the reference was fragile: when the uniform lies
// within kMargin of the device token's CDF interval (a shift of the CDF that small, as float sums in another order
// make, would pick it: the next kept token when the uniform sat on an edge, or one further on across a run of
// tokens whose probabilities are below kMargin), or when the nucleus edge did and the device's token is inside the
// pre-top_p set.
bool tolerated_mismatch(const SampleMargins& margins, int32_t device) {
  constexpr double kMargin = 1e-5;
  if (margins.device_draw < kMargin) return true;
  return margins.nucleus < kMargin &&
         std::binary_search(margins.kept_before_top_p.begin(), margins.kept_before_top_p.end(), device);
}

// Samples `rows` of `logits` [logit_rows, vocab] on both backends (the device twice, timing the second call) and
// records the tokens and the logprobs, naming failing rows by row_mode.
void check_sample(Harness& harness, const std::vector<float>& logits, int64_t logit_rows, int64_t vocab,
                  const std::vector<SampleRow>& rows, const std::vector<const char*>& row_mode, const std::string& shape,
                  std::chrono::steady_clock::time_point start) {
  const auto count = static_cast<int64_t>(rows.size());
  constexpr int64_t kWidth = 20;
  auto input = harness.f32(logits, {logit_rows, vocab});
  auto tokens = harness.poisoned(DType::I32, {count});
  auto logprobs = harness.poisoned(DType::F32, {count});
  auto ranks = harness.poisoned(DType::I32, {count});
  auto top_ids = harness.poisoned(DType::I32, {count, kWidth});
  auto top_logprobs = harness.poisoned(DType::F32, {count, kWidth});
  SampleOutputs device_out{tokens.device, logprobs.device, ranks.device, top_ids.device, top_logprobs.device};
  SampleOutputs reference_out{tokens.reference, logprobs.reference, ranks.reference, top_ids.reference,
                              top_logprobs.reference};
  harness.device().sample(input.device, rows, device_out);
  harness.device().synchronize();
  const auto device_start = std::chrono::steady_clock::now();
  harness.device().sample(input.device, rows, device_out);
  harness.device().synchronize();
  const double device_ms = seconds_since(device_start) * 1e3;
  harness.reference().sample(input.reference, rows, reference_out);

  const std::vector<int32_t> device_tokens = harness.device().download_i32(tokens.device);
  const std::vector<int32_t> reference_tokens = harness.reference().download_i32(tokens.reference);
  const std::vector<float> device_logprobs = harness.device().download_f32(logprobs.device);
  const std::vector<float> reference_logprobs = harness.reference().download_f32(logprobs.reference);
  const std::vector<int32_t> device_ranks = harness.device().download_i32(ranks.device);
  const std::vector<int32_t> reference_ranks = harness.reference().download_i32(ranks.reference);
  const std::vector<int32_t> device_top = harness.device().download_i32(top_ids.device);
  const std::vector<int32_t> reference_top = harness.reference().download_i32(top_ids.reference);
  const std::vector<float> device_top_logprobs = harness.device().download_f32(top_logprobs.device);
  const std::vector<float> reference_top_logprobs = harness.reference().download_f32(top_logprobs.reference);

  int64_t wrong = 0, tolerated = 0, wrong_ids = 0;
  double logprob_error = 0.0;
  std::string failing, first_failure;
  for (int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<std::size_t>(i);
    const SampleRow& row = rows[index];
    const int32_t reference = reference_tokens[index], device = device_tokens[index];
    bool same = reference == device;
    if (!same) {
      const std::vector<float> raw(logits.begin() + row.logit_row * vocab, logits.begin() + (row.logit_row + 1) * vocab);
      const bool in_range = device >= 0 && device < vocab;
      const SampleMargins margins = in_range ? sample_margins(raw, row, reference, device) : SampleMargins{};
      if (in_range && !row.greedy && tolerated_mismatch(margins, device)) {
        ++tolerated;
      } else {
        ++wrong;
        if (failing.find(row_mode[index]) == std::string::npos) failing += fmt::format(" {}", row_mode[index]);
        if (first_failure.empty())
          first_failure = fmt::format("; first: row {} (logit row {}): reference {}, device {}, uniform {:.9f} at "
                                      "{:.3g} from the reference's edges and {:.3g} from the device token's interval",
                                      i, row.logit_row, reference, device, row.uniform, margins.draw,
                                      margins.device_draw);
      }
    }
    if (row.num_logprobs < 0) continue;
    if (same) {
      logprob_error = std::max(logprob_error, static_cast<double>(std::abs(device_logprobs[index] - reference_logprobs[index])));
      wrong_ids += device_ranks[index] != reference_ranks[index];
    }
    for (int64_t j = 0; j < row.num_logprobs; ++j) {
      const auto at = static_cast<std::size_t>(i * kWidth + j);
      wrong_ids += device_top[at] != reference_top[at];
      logprob_error = std::max(logprob_error, static_cast<double>(std::abs(device_top_logprobs[at] - reference_top_logprobs[at])));
    }
    if (std::isnan(logprob_error)) logprob_error = std::numeric_limits<double>::infinity();
  }
  harness.record_result({"sample tokens", shape, static_cast<double>(wrong), 0.0,
                         fmt::format("{} near-boundary differences tolerated; device {:.3f} ms{}{}{}", tolerated,
                                     device_ms, failing.empty() ? "" : "; failing:", failing, first_failure),
                         wrong == 0, seconds_since(start)});
  harness.record_result({"sample logprobs", shape, logprob_error, 1e-4, fmt::format("{} rank/top-id differences", wrong_ids),
                         logprob_error <= 1e-4 && wrong_ids == 0, seconds_since(start)});
}

struct SampleMode {
  const char* name;
  SampleRow settings;
};

SampleMode sample_mode(const char* name, bool greedy, float temperature, float min_p, int32_t top_k, float top_p) {
  SampleRow row;
  row.greedy = greedy;
  row.temperature = temperature;
  row.min_p = min_p;
  row.top_k = top_k;
  row.top_p = top_p;
  return SampleMode{name, row};
}

}  // namespace

void test_sample(Harness& harness) {
  const std::vector<SampleMode> modes{sample_mode("greedy", true, 1.0f, 0.0f, 0, 1.0f),
                                      sample_mode("temperature", false, 0.7f, 0.0f, 0, 1.0f),
                                      sample_mode("top_k 1", false, 1.0f, 0.0f, 1, 1.0f),
                                      sample_mode("top_k 50", false, 1.3f, 0.0f, 50, 1.0f),
                                      sample_mode("top_p 0.9", false, 1.0f, 0.0f, 0, 0.9f),
                                      sample_mode("top_p 1e-6", false, 1.0f, 0.0f, 0, 1e-6f),
                                      sample_mode("min_p 0.1", false, 1.0f, 0.1f, 0, 1.0f),
                                      sample_mode("combined", false, 0.8f, 0.05f, 40, 0.95f)};
  // On the CUDA backend 8 and 16 rows split each row over a cluster of 8 blocks, 56 over 2, 512 not at all.
  for (int64_t vocab : {201088L, 4096L, 1000L, 1001L}) {
    for (int64_t logit_rows : {1L, 2L, 7L, 64L}) {
      const auto start = std::chrono::steady_clock::now();
      // LM-like logits (a few dominant tokens); every fourth row has few distinct values (ties everywhere) and
      // row 2 holds NaNs.
      std::normal_distribution<float> normal(0.0f, 4.0f);
      std::vector<float> logits(static_cast<std::size_t>(logit_rows * vocab));
      for (float& l : logits) l = normal(harness.inputs().rng());
      for (int64_t r = 3; r < logit_rows; r += 4)
        for (int64_t t = 0; t < vocab; ++t) logits[r * vocab + t] = std::round(logits[r * vocab + t] / 3.0f);
      if (logit_rows > 2)
        for (int64_t t = 0; t < vocab; t += 7) logits[2 * vocab + t] = std::numeric_limits<float>::quiet_NaN();
      std::vector<SampleRow> rows;
      std::vector<const char*> row_mode;
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      for (const SampleMode& m : modes) {
        for (int64_t r = 0; r < logit_rows; ++r) {
          SampleRow row = m.settings;
          row.logit_row = static_cast<int32_t>(r);
          row.uniform = uniform(harness.inputs().rng());
          row.num_logprobs = rows.size() % 3 == 0 ? -1 : (rows.size() % 3 == 1 ? 0 : (rows.size() % 2 ? 5 : 20));
          rows.push_back(row);
          row_mode.push_back(m.name);
        }
      }
      check_sample(harness, logits, logit_rows, vocab, rows, row_mode,
                   fmt::format("V {} R {} ({} rows, {} modes)", vocab, logit_rows, rows.size(), modes.size()), start);
    }
  }
  // Rows that reach the device's less common paths (its selection sorts tokens into levels by their distance
  // from the maximum, gathers the level that holds a cut when it fits in shared memory and searches the row
  // otherwise): no finite logit; one value everywhere; more distinct values in one level than fit; values on
  // the level edges, each tied many times; three finite values (top_k and the top logprobs beyond them).
  const std::vector<SampleMode> edge_modes{sample_mode("greedy", true, 1.0f, 0.0f, 0, 1.0f),
                                           sample_mode("temperature 1", false, 1.0f, 0.0f, 0, 1.0f),
                                           sample_mode("top_k 50", false, 1.0f, 0.0f, 50, 1.0f),
                                           sample_mode("top_p 0.5", false, 1.0f, 0.0f, 0, 0.5f),
                                           sample_mode("top_p 1", false, 0.9f, 0.0f, 0, 1.0f),
                                           sample_mode("min_p 0.2", false, 1.0f, 0.2f, 0, 1.0f),
                                           sample_mode("top_k 3 top_p 0.9", false, 1.0f, 0.0f, 3, 0.9f),
                                           sample_mode("top_k V-1 top_p 0.99", false, 1.0f, 0.0f, -1, 0.99f)};
  for (int64_t vocab : {201088L, 1001L}) {
    const auto start = std::chrono::steady_clock::now();
    constexpr int64_t kEdgeRows = 5;
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> logits(static_cast<std::size_t>(kEdgeRows * vocab));
    std::uniform_real_distribution<float> narrow(-0.4f, 0.4f);
    for (int64_t t = 0; t < vocab; ++t) {
      logits[0 * vocab + t] = -inf;
      logits[1 * vocab + t] = 1.5f;
      logits[2 * vocab + t] = t % 2 ? narrow(harness.inputs().rng()) : -inf;
      logits[3 * vocab + t] = 10.0f - 0.25f * static_cast<float>(t % 64);
      logits[4 * vocab + t] = t == 5 || t == 77 || t == vocab - 1 ? static_cast<float>(t % 3) : -inf;
    }
    std::vector<SampleRow> rows;
    std::vector<const char*> row_mode;
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (const SampleMode& m : edge_modes) {
      for (int64_t r = 0; r < kEdgeRows; ++r) {
        SampleRow row = m.settings;
        if (row.top_k < 0) row.top_k = static_cast<int32_t>(vocab - 1);
        row.logit_row = static_cast<int32_t>(r);
        row.uniform = uniform(harness.inputs().rng());
        // The reference's logprobs of a row without a finite logit are NaN: that row asks for none.
        row.num_logprobs = r == 0 ? -1 : 5;
        rows.push_back(row);
        row_mode.push_back(m.name);
      }
    }
    check_sample(harness, logits, kEdgeRows, vocab, rows, row_mode,
                 fmt::format("edges V {} ({} rows, {} modes)", vocab, rows.size(), edge_modes.size()), start);
    // The flat, narrow and level-edge rows under the cutting modes again, few enough rows for the CUDA backend to
    // split each over a cluster of blocks.
    std::vector<SampleRow> few_rows;
    std::vector<const char*> few_mode;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const int32_t r = rows[i].logit_row;
      if ((r >= 1 && r <= 3) && (rows[i].top_k > 0 || rows[i].top_p < 1.0f)) {
        few_rows.push_back(rows[i]);
        few_mode.push_back(row_mode[i]);
      }
    }
    check_sample(harness, logits, kEdgeRows, vocab, few_rows, few_mode,
                 fmt::format("edges V {}, flat rows ({} rows)", vocab, few_rows.size()), start);
  }
}


// ---- perf ----

namespace {

struct PerfOptions {
  std::string preset = "beam-1.0";
  std::vector<int64_t> rows{1, 8, 64, 512};
  std::vector<std::string> modes{"mixed", "greedy", "temperature", "top_k", "top_p", "min_p", "combined"};
  int64_t iterations = 30;
  uint64_t seed = 1;
};

#ifdef BEAMLINE_HAVE_CUDA
constexpr int64_t kTopWidth = 20;

void check(cudaError_t status, const char* what) { check_cuda(status, "sample", what); }

SampleRow filtered(float temperature, float min_p, int32_t top_k, float top_p) {
  SampleRow row;
  row.temperature = temperature;
  row.min_p = min_p;
  row.top_k = top_k;
  row.top_p = top_p;
  return row;
}

// The settings of row `r` in `mode`; "mixed" cycles through the test mode's eight modes and its logprob requests
// (none, the token's own, 5 or 20 of the best), so that its 8-row call is the harness's one-row-per-mode case.
SampleRow row_settings(const std::string& mode, int64_t r) {
  const std::vector<SampleRow> harness_modes{
      [] {
        SampleRow greedy;
        greedy.greedy = true;
        return greedy;
      }(),
      filtered(0.7f, 0.0f, 0, 1.0f),  filtered(1.0f, 0.0f, 1, 1.0f),   filtered(1.3f, 0.0f, 50, 1.0f),
      filtered(1.0f, 0.0f, 0, 0.9f),  filtered(1.0f, 0.0f, 0, 1e-6f),  filtered(1.0f, 0.1f, 0, 1.0f),
      filtered(0.8f, 0.05f, 40, 0.95f)};
  SampleRow row;
  if (mode == "mixed") {
    row = harness_modes[static_cast<std::size_t>(r) % harness_modes.size()];
    row.num_logprobs = r % 3 == 0 ? -1 : (r % 3 == 1 ? 0 : (r % 2 ? 5 : 20));
  } else if (mode == "greedy") {
    row = harness_modes[0];
  } else if (mode == "temperature") {
    row = harness_modes[1];
  } else if (mode == "top_k") {
    row = harness_modes[3];
  } else if (mode == "top_p") {
    row = harness_modes[4];
  } else if (mode == "min_p") {
    row = harness_modes[6];
  } else if (mode == "combined") {
    row = harness_modes[7];
  } else {
    fail("perf sample: unknown mode {} (mixed, greedy, temperature, top_k, top_p, min_p, combined)", mode);
  }
  row.logit_row = static_cast<int32_t>(r);
  return row;
}

void run_perf(const PerfOptions& options) {
  require(options.iterations >= 1, "perf sample: --iterations must be >= 1");
  const int64_t vocab = preset_config(options.preset).vocab_size;
  int64_t max_rows = 0;
  for (const int64_t rows : options.rows) {
    require(rows >= 1, "perf sample: --rows must be >= 1");
    max_rows = std::max(max_rows, rows);
  }
  CudaBackend backend;
  spdlog::info("perf sample: {} rows of V = {} on {}", max_rows, vocab, backend.device_description());
  const Tensor logits = backend.random_weight(DType::F32, {max_rows, vocab}, options.seed, 0.0f, 4.0f);
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);

  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::printf("\n| mode | rows | V | ms (median) | floor ms | floor / time |\n| --- | --- | --- | --- | --- | --- |\n");
  for (const std::string& mode : options.modes) {
    for (const int64_t count : options.rows) {
      std::vector<SampleRow> rows;
      for (int64_t r = 0; r < count; ++r) rows.push_back(row_settings(mode, r));
      SampleOutputs out{backend.alloc(DType::I32, {count}), backend.alloc(DType::F32, {count}),
                        backend.alloc(DType::I32, {count}), backend.alloc(DType::I32, {count, kTopWidth}),
                        backend.alloc(DType::F32, {count, kTopWidth})};
      std::vector<double> ms;
      for (int64_t i = 0; i <= options.iterations; ++i) {
        for (SampleRow& row : rows) row.uniform = uniform(rng);
        check(cudaEventRecord(start, backend.stream()), "cudaEventRecord");
        backend.sample(logits, rows, out);
        check(cudaEventRecord(stop, backend.stream()), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float elapsed = 0;
        check(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
        if (i > 0) ms.push_back(elapsed);  // the first call sets up the kernels' shared-memory limits
      }
      const double time_ms = median(ms);
      const double floor_ms = 4.0 * static_cast<double>(count * vocab) / kHbmBytesPerSecond * 1e3;
      std::printf("| %s | %lld | %lld | %.4f | %.4f | %.2f |\n", mode.c_str(), static_cast<long long>(count),
                  static_cast<long long>(vocab), time_ms, floor_ms, floor_ms / time_ms);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}
#endif

}  // namespace

void add_sample_perf(CLI::App& perf) {
  auto options = std::make_shared<PerfOptions>();
  CLI::App* command = perf.add_subcommand(
      "sample", "Time Backend::sample on the GPU over random logits of a preset's vocabulary, per row count and "
                      "filter mode, next to the HBM floor");
  command->add_option("--preset", options->preset, "model shape (its vocabulary size)")->capture_default_str();
  command->add_option("--rows", options->rows, "row counts")->delimiter(',')->capture_default_str();
  command->add_option("--mode", options->modes,
                      "filter modes, each a table section (mixed = the test mode's eight modes and logprob "
                      "requests in turn; greedy, temperature, top_k, top_p, min_p, combined)")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed calls per case (median reported)")
      ->capture_default_str();
  command->add_option("--seed", options->seed, "seed of the logits and the draws")->capture_default_str();
  command->callback([options] {
#ifdef BEAMLINE_HAVE_CUDA
    run_perf(*options);
#else
    perf_needs_cuda("sample");
#endif
  });
}

}  // namespace beamline::backend_ops

// Backend::sample against a naive reference (full sorts, double sums) on random logits, for every mode: greedy,
// temperature, min_p, top_k with ties, top_p, combined, logprobs, NaN and all -inf rows, rows read in any order.
// The CPU backend must agree exactly; a device backend may differ only where the reference's uniform or top_p
// target sits within 1e-5 of a boundary (float summation order).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend_test_support.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kBoundaryMargin = 1e-5;

struct Expected {
  int32_t token = 0;
  double margin = 1.0;  // distance (as a fraction of the kept mass) of the draw or the top_p target from a boundary
  float logprob = 0.0f;
  int32_t rank = 1;
  std::vector<std::pair<int32_t, float>> top;
};

// Higher value first, then lower id.
std::vector<int32_t> ranked(const std::vector<float>& values) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  return order;
}

Expected naive_sample(std::vector<float> v, const SampleRow& row) {
  for (float& x : v) {
    if (std::isnan(x)) x = -kInf;
  }
  const auto n = static_cast<int32_t>(v.size());
  Expected e;
  const std::vector<int32_t> raw_order = ranked(v);
  if (row.greedy) {
    e.token = raw_order[0];
  } else {
    std::vector<float> s(v.size());
    for (int32_t i = 0; i < n; ++i) s[i] = v[i] / row.temperature;
    const float best = *std::max_element(s.begin(), s.end());
    if (row.min_p > 0.0f) {
      const float threshold = best + std::log(row.min_p);
      for (float& x : s) x = x < threshold ? -kInf : x;
    }
    if (row.top_k > 0 && row.top_k < n) {
      std::vector<float> sorted = s;
      std::sort(sorted.rbegin(), sorted.rend());
      const float kth = sorted[row.top_k - 1];
      for (float& x : s) x = x < kth ? -kInf : x;
    }
    auto weight = [&](int32_t i) { return s[i] == -kInf ? 0.0 : std::exp(static_cast<double>(s[i] - best)); };
    double total = 0;
    for (int32_t i = 0; i < n; ++i) total += weight(i);
    if (row.top_p < 1.0f && best != -kInf) {
      const double target = row.top_p * total;
      double cumulative = 0;
      std::vector<bool> keep(v.size(), false);
      for (int32_t i : ranked(s)) {
        if (cumulative >= target || s[i] == -kInf) break;
        keep[i] = true;
        e.margin = std::min(e.margin, std::abs(cumulative - target) / total);
        cumulative += weight(i);
        e.margin = std::min(e.margin, std::abs(cumulative - target) / total);
      }
      total = 0;
      for (int32_t i = 0; i < n; ++i) {
        s[i] = keep[i] ? s[i] : -kInf;
        total += weight(i);
      }
    }
    const double target = row.uniform * total;
    double cumulative = 0;
    e.token = best == -kInf ? 0 : -1;
    for (int32_t i = 0; i < n && e.token < 0; ++i) {
      if (s[i] == -kInf) continue;
      e.margin = std::min(e.margin, std::abs(cumulative - target) / total);
      cumulative += weight(i);
      if (cumulative > target) e.token = i;
    }
    if (e.token < 0) e.token = static_cast<int32_t>(n - 1 - (std::find_if(s.rbegin(), s.rend(), [](float x) { return x != -kInf; }) - s.rbegin()));
  }
  if (row.num_logprobs >= 0) {
    const float top = v[raw_order[0]];
    double sum = 0;
    for (float x : v) sum += std::exp(static_cast<double>(x - top));
    const double log_total = top + std::log(sum);
    e.logprob = static_cast<float>(v[e.token] - log_total);
    e.rank = 1 + static_cast<int32_t>(std::count_if(v.begin(), v.end(), [&](float x) { return x > v[e.token]; }));
    for (int32_t j = 0; j < std::min(row.num_logprobs, n); ++j)
      e.top.emplace_back(raw_order[j], static_cast<float>(v[raw_order[j]] - log_total));
  }
  return e;
}

class SampleTest : public BackendTest {
 protected:
  // Samples `rows` of `logits` [R, V] on the backend and checks every output against the reference.
  void check(const std::vector<float>& logits, int64_t vocab, const std::vector<SampleRow>& rows,
             const std::string& what) {
    const auto count = static_cast<int64_t>(rows.size());
    const int64_t width = 23;
    const Tensor input = backend().upload_f32(logits, {static_cast<int64_t>(logits.size()) / vocab, vocab});
    SampleOutputs out;
    out.tokens = backend().upload_i32(std::vector<int32_t>(rows.size(), -7), {count});
    out.logprobs = backend().upload_f32(std::vector<float>(rows.size(), 99.0f), {count});
    out.ranks = backend().upload_i32(std::vector<int32_t>(rows.size(), -7), {count});
    out.top_ids = backend().upload_i32(std::vector<int32_t>(rows.size() * width, -7), {count, width});
    out.top_logprobs = backend().upload_f32(std::vector<float>(rows.size() * width, 99.0f), {count, width});
    backend().sample(input, rows, out);
    const auto tokens = backend().download_i32(out.tokens), ranks = backend().download_i32(out.ranks);
    const auto logprobs = backend().download_f32(out.logprobs);
    const auto top_ids = backend().download_i32(out.top_ids);
    const auto top_logprobs = backend().download_f32(out.top_logprobs);
    const bool exact = backend().device() == Device::Cpu;
    int near_boundary = 0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const SampleRow& row = rows[r];
      const std::vector<float> raw(logits.begin() + row.logit_row * vocab, logits.begin() + (row.logit_row + 1) * vocab);
      const Expected e = naive_sample(raw, row);
      const std::string where = what + " row " + std::to_string(r);
      if (tokens[r] != e.token) {
        ASSERT_TRUE(!exact && e.margin < kBoundaryMargin) << where << ": token " << tokens[r] << ", expected " << e.token
                                                          << " (margin " << e.margin << ")";
        ++near_boundary;
        continue;  // its logprobs are of another token
      }
      if (row.num_logprobs < 0) {
        EXPECT_EQ(logprobs[r], 99.0f) << where << ": logprob written though none was asked";
        EXPECT_EQ(top_ids[r * width], -7) << where;
        continue;
      }
      EXPECT_NEAR(logprobs[r], e.logprob, 1e-4) << where;
      EXPECT_EQ(ranks[r], e.rank) << where;
      for (int64_t j = 0; j < width; ++j) {
        const auto at = static_cast<std::size_t>(static_cast<int64_t>(r) * width + j);
        if (j < static_cast<int64_t>(e.top.size())) {
          EXPECT_EQ(top_ids[at], e.top[j].first) << where << " top " << j;
          EXPECT_NEAR(top_logprobs[at], e.top[j].second, 1e-4) << where << " top " << j;
        } else {
          EXPECT_EQ(top_ids[at], -7) << where << ": top entry " << j << " written past num_logprobs";
        }
      }
    }
    EXPECT_LE(near_boundary, std::max<int>(1, static_cast<int>(rows.size()) / 20)) << what;
  }
};

std::vector<float> random_logits(Random& random, int64_t rows, int64_t vocab, float scale, int32_t distinct) {
  std::vector<float> values = random.normal(static_cast<std::size_t>(rows * vocab), scale);
  if (distinct > 0)  // few distinct values: ties everywhere
    for (float& x : values) x = std::round(x * static_cast<float>(distinct) / (4.0f * scale)) / static_cast<float>(distinct);
  return values;
}

// Every mode over rows read in shuffled order, some twice.
std::vector<SampleRow> mixed_rows(Random& random, int64_t logit_rows, int64_t vocab) {
  std::vector<SampleRow> rows;
  for (int i = 0; i < 40; ++i) {
    SampleRow row;
    row.logit_row = random.integer(0, static_cast<int32_t>(logit_rows - 1));
    row.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(random.engine());
    row.temperature = std::uniform_real_distribution<float>(0.3f, 2.0f)(random.engine());
    switch (i % 8) {
      case 0: row.greedy = true; break;
      case 1: break;  // temperature only
      case 2: row.top_k = random.integer(1, 50); break;
      case 3: row.top_k = 1; break;
      case 4: row.top_p = std::uniform_real_distribution<float>(0.05f, 0.99f)(random.engine()); break;
      case 5: row.top_p = 1e-6f; break;
      case 6: row.min_p = std::uniform_real_distribution<float>(0.01f, 0.5f)(random.engine()); break;
      default:
        row.min_p = 0.02f;
        row.top_k = random.integer(2, 300);
        row.top_p = 0.8f;
    }
    row.num_logprobs = i % 3 == 0 ? -1 : (i % 3 == 1 ? 0 : random.integer(1, static_cast<int32_t>(std::min<int64_t>(20, vocab))));
    rows.push_back(row);
  }
  return rows;
}

TEST_P(SampleTest, EveryModeAgainstTheNaiveReference) {
  Random random(11);
  for (int64_t vocab : {1L, 7L, 1000L, 4097L}) {
    for (int32_t distinct : {0, 3}) {
      const int64_t logit_rows = 9;
      const std::vector<float> logits = random_logits(random, logit_rows, vocab, 3.0f, distinct);
      check(logits, vocab, mixed_rows(random, logit_rows, vocab),
            "V " + std::to_string(vocab) + (distinct ? " ties" : ""));
    }
  }
}

TEST_P(SampleTest, NanCountsAsMinusInfinityAndAnEmptyRowGivesZero) {
  Random random(12);
  const int64_t vocab = 300;
  std::vector<float> logits = random_logits(random, 3, vocab, 2.0f, 0);
  for (int64_t i = 0; i < vocab; i += 3) logits[i] = std::numeric_limits<float>::quiet_NaN();
  logits[5] = 50.0f;  // row 0's clear winner sits between NaNs
  for (int64_t i = vocab; i < 2 * vocab; ++i) logits[i] = -kInf;
  for (int64_t i = 2 * vocab; i < 3 * vocab; ++i) logits[i] = i % 2 ? std::numeric_limits<float>::quiet_NaN() : -kInf;
  std::vector<SampleRow> rows;
  for (int32_t r = 0; r < 3; ++r) {
    for (bool greedy : {true, false}) {
      SampleRow row;
      row.logit_row = r;
      row.greedy = greedy;
      row.top_p = 0.5f;
      row.top_k = 10;
      row.uniform = 0.7;
      row.num_logprobs = r == 0 ? 4 : -1;
      rows.push_back(row);
    }
  }
  check(logits, vocab, rows, "NaN rows");
  for (SampleRow& row : rows) row.num_logprobs = -1;
  const Tensor input = backend().upload_f32(logits, {3, vocab});
  SampleOutputs out;
  out.tokens = backend().alloc(DType::I32, {6});
  backend().sample(input, rows, out);
  EXPECT_EQ(backend().download_i32(out.tokens), (std::vector<int32_t>{5, 5, 0, 0, 0, 0}));
}

TEST_P(SampleTest, TopKKeepsEveryTieWithTheKth) {
  // Four tokens share the best value: top_k = 1 keeps all four, and uniforms across [0, 1) reach each.
  const int64_t vocab = 64;
  std::vector<float> logits(vocab, -3.0f);
  for (int64_t t : {9, 20, 21, 60}) logits[t] = 2.0f;
  std::vector<SampleRow> rows;
  for (double u : {0.01, 0.3, 0.6, 0.99}) {
    SampleRow row;
    row.top_k = 1;
    row.uniform = u;
    rows.push_back(row);
  }
  check(logits, vocab, rows, "top_k ties");
  const Tensor input = backend().upload_f32(logits, {1, vocab});
  SampleOutputs out;
  out.tokens = backend().alloc(DType::I32, {4});
  backend().sample(input, rows, out);
  EXPECT_EQ(backend().download_i32(out.tokens), (std::vector<int32_t>{9, 20, 21, 60}));
}

TEST_P(SampleTest, BadArgumentsAreErrors) {
  const Tensor logits = backend().upload_f32(std::vector<float>(20, 0.0f), {2, 10});
  SampleOutputs out;
  out.tokens = backend().alloc(DType::I32, {1});
  SampleRow row;
  row.logit_row = 2;
  EXPECT_THROW(backend().sample(logits, std::vector<SampleRow>{row}, out), Error);
  row.logit_row = 1;
  row.top_p = 0.0f;
  EXPECT_THROW(backend().sample(logits, std::vector<SampleRow>{row}, out), Error);
  row.top_p = 1.0f;
  row.num_logprobs = 2;  // no logprob outputs
  EXPECT_THROW(backend().sample(logits, std::vector<SampleRow>{row}, out), Error);
  row.num_logprobs = -1;
  EXPECT_NO_THROW(backend().sample(logits, std::vector<SampleRow>{row}, out));
}

INSTANTIATE_TEST_SUITE_P(Backends, SampleTest, ::testing::ValuesIn(backend_names()));

}  // namespace
}  // namespace beamline::testing

// The FP32 noaux_tc router: random inputs against a naive implementation, and the edge cases of
// docs/model-format.md §4 (ties, group limiting, bias chooses but never weighs, renormalisation, scaling).
#include <algorithm>
#include <numeric>

#include "backend_test_support.h"

namespace beamline::testing {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Runs the router on logits chosen directly: hidden = E, router = identity, h[t] = logits of token t.
Routed route_logits(Backend& backend, const std::vector<float>& logits, int64_t experts, const std::vector<float>& bias,
                    const RouterParams& params) {
  const auto rows = static_cast<int64_t>(logits.size()) / experts;
  std::vector<float> identity(static_cast<std::size_t>(experts * experts), 0.0f);
  for (int64_t e = 0; e < experts; ++e) identity[e * experts + e] = 1.0f;
  Tensor ids = backend.alloc(DType::I32, {rows, params.top_k});
  Tensor weights = backend.alloc(DType::F32, {rows, params.top_k});
  backend.route(backend.upload_f32(logits, {rows, experts}), backend.upload_f32(identity, {experts, experts}),
                backend.upload_f32(bias, {experts}), params, ids, weights);
  return {backend.download_i32(ids), backend.download_f32(weights)};
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Written as a sort over (value, index) pairs, unlike the backend's selection.
Routed naive_route(const std::vector<double>& logits, const std::vector<float>& bias, const RouterParams& p) {
  const auto experts = static_cast<int32_t>(bias.size());
  const int32_t group_size = experts / p.n_group;
  std::vector<double> score(experts), choice(experts);
  for (int32_t e = 0; e < experts; ++e) {
    score[e] = sigmoid(logits[e]);
    choice[e] = score[e] + bias[e];
  }
  std::vector<std::pair<double, int32_t>> groups;
  for (int32_t g = 0; g < p.n_group; ++g) {
    std::vector<double> members(choice.begin() + g * group_size, choice.begin() + (g + 1) * group_size);
    std::sort(members.rbegin(), members.rend());
    groups.push_back({-(members[0] + (group_size > 1 ? members[1] : 0.0)), g});
  }
  std::sort(groups.begin(), groups.end());
  std::vector<std::pair<double, int32_t>> candidates;
  for (int32_t i = 0; i < p.topk_group; ++i)
    for (int32_t e = groups[i].second * group_size; e < (groups[i].second + 1) * group_size; ++e)
      candidates.push_back({-choice[e], e});
  std::sort(candidates.begin(), candidates.end());
  Routed routed;
  double total = 0;
  for (int32_t j = 0; j < p.top_k; ++j) total += score[candidates[j].second];
  for (int32_t j = 0; j < p.top_k; ++j) {
    const int32_t e = candidates[j].second;
    routed.ids.push_back(e);
    routed.weights.push_back(static_cast<float>((p.norm_topk_prob ? score[e] / total : score[e]) * p.routed_scaling_factor));
  }
  return routed;
}

using RouterTest = BackendTest;

TEST_P(RouterTest, RandomInputsMatchNaiveRouting) {
  Random random(30);
  struct Shape {
    int64_t rows, hidden, experts;
    RouterParams params;
  };
  const std::vector<Shape> shapes{
      {5, 16, 8, {4, 2, 2, true, 2.5f}},  {9, 33, 16, {1, 1, 4, true, 1.0f}}, {7, 64, 32, {8, 3, 5, false, 1.5f}},
      {3, 20, 6, {3, 3, 6, true, 2.0f}},  {11, 40, 64, {8, 4, 8, true, 2.5f}},
  };
  for (const Shape& s : shapes) {
    const std::vector<float> h = random.normal(s.rows * s.hidden);
    const std::vector<float> router = random.normal(s.experts * s.hidden, 1.0f / std::sqrt(static_cast<float>(s.hidden)));
    const std::vector<float> bias = random.normal(s.experts, 0.05f);
    Tensor ids = backend().alloc(DType::I32, {s.rows, s.params.top_k});
    Tensor weights = backend().alloc(DType::F32, {s.rows, s.params.top_k});
    backend().route(backend().upload_f32(h, {s.rows, s.hidden}), backend().upload_f32(router, {s.experts, s.hidden}),
                    backend().upload_f32(bias, {s.experts}), s.params, ids, weights);
    const std::vector<int32_t> got_ids = backend().download_i32(ids);
    const std::vector<float> got_weights = backend().download_f32(weights);
    for (int64_t t = 0; t < s.rows; ++t) {
      std::vector<double> logits(static_cast<std::size_t>(s.experts));
      for (int64_t e = 0; e < s.experts; ++e)
        for (int64_t i = 0; i < s.hidden; ++i) logits[e] += double{h[t * s.hidden + i]} * router[e * s.hidden + i];
      const Routed expected = naive_route(logits, bias, s.params);
      for (int32_t j = 0; j < s.params.top_k; ++j) {
        EXPECT_EQ(got_ids[t * s.params.top_k + j], expected.ids[j]) << "token " << t << " slot " << j;
        EXPECT_NEAR(got_weights[t * s.params.top_k + j], expected.weights[j], 1e-5) << "token " << t << " slot " << j;
      }
    }
  }
}

TEST_P(RouterTest, TiesGoToTheLowerIndex) {
  // All scores equal: groups 0 and 1 win over 2 and 3, and inside them experts 0, 1, 2 come first.
  const RouterParams params{4, 2, 3, true, 1.0f};
  const Routed routed = route_logits(backend(), std::vector<float>(8, 0.25f), 8, std::vector<float>(8, 0.0f), params);
  EXPECT_EQ(routed.ids, (std::vector<int32_t>{0, 1, 2}));
  for (float w : routed.weights) EXPECT_NEAR(w, 1.0 / 3.0, 1e-6);
  // A tie between experts 3 and 5 (different groups, both kept) after the clear winner 6.
  const std::vector<float> logits{-5, -5, -5, 1, -5, 1, 2, -5};
  const Routed second = route_logits(backend(), logits, 8, std::vector<float>(8, 0.0f), {1, 1, 3, true, 1.0f});
  EXPECT_EQ(second.ids, (std::vector<int32_t>{6, 3, 5}));
}

TEST_P(RouterTest, GroupLimitingExcludesTheBestExpertOfALosingGroup) {
  // Groups of 2: {0,1}, {2,3}, {4,5}, {6,7}. Expert 6 has the highest score, but its partner 7 is so low
  // that group 3's sum of its two best loses to groups 0 and 1.
  const std::vector<float> logits{2.0f, 2.0f, 1.5f, 1.5f, -4.0f, -4.0f, 6.0f, -8.0f};
  const RouterParams params{4, 2, 2, true, 1.0f};
  const Routed routed = route_logits(backend(), logits, 8, std::vector<float>(8, 0.0f), params);
  EXPECT_EQ(routed.ids, (std::vector<int32_t>{0, 1}));
  // Without group limiting expert 6 wins.
  const Routed unlimited = route_logits(backend(), logits, 8, std::vector<float>(8, 0.0f), {1, 1, 2, true, 1.0f});
  EXPECT_EQ(unlimited.ids, (std::vector<int32_t>{6, 0}));
}

TEST_P(RouterTest, BiasChoosesButNeverWeighs) {
  const std::vector<float> logits{1.0f, 0.5f, 0.0f, -0.5f};
  std::vector<float> bias(4, 0.0f);
  bias[3] = 0.9f;  // sigmoid(-0.5) + 0.9 = 1.28 > sigmoid(1) = 0.73
  const RouterParams params{1, 1, 2, false, 1.0f};
  const Routed routed = route_logits(backend(), logits, 4, bias, params);
  EXPECT_EQ(routed.ids, (std::vector<int32_t>{3, 0}));
  EXPECT_NEAR(routed.weights[0], sigmoid(-0.5), 1e-6);
  EXPECT_NEAR(routed.weights[1], sigmoid(1.0), 1e-6);
}

TEST_P(RouterTest, RenormalisationAndScaling) {
  const std::vector<float> logits{0.3f, -1.0f, 2.0f, 0.0f, -0.2f, 1.0f};
  const std::vector<float> bias(6, 0.0f);
  const double s2 = sigmoid(2.0), s5 = sigmoid(1.0);
  const Routed normalized = route_logits(backend(), logits, 6, bias, {1, 1, 2, true, 2.5f});
  EXPECT_EQ(normalized.ids, (std::vector<int32_t>{2, 5}));
  EXPECT_NEAR(normalized.weights[0], 2.5 * s2 / (s2 + s5), 1e-6);
  EXPECT_NEAR(normalized.weights[1], 2.5 * s5 / (s2 + s5), 1e-6);
  const Routed raw = route_logits(backend(), logits, 6, bias, {1, 1, 2, false, 2.5f});
  EXPECT_NEAR(raw.weights[0], 2.5 * s2, 1e-6);
  EXPECT_NEAR(raw.weights[1], 2.5 * s5, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Backends, RouterTest, ::testing::ValuesIn(backend_names()));

}  // namespace
}  // namespace beamline::testing

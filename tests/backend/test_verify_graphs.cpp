// Verify steps (speculative decoding: 1 + k rows per sequence, every row a logit row) replay recorded decode graphs
// (runner/decode_graphs.h) keyed by the bucket and k, not by how many sequences fill the bucket: steps of 3 and of 4
// sequences (bucket 4) share one recording, and the replayed logits are those of the same steps run op by op.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend_test_support.h"
#include "checkpoint/presets.h"
#include "model/beam_model.h"
#include "model/model_test_support.h"
#include "runner/decode_graphs.h"
#include "runner/kv_cache.h"

namespace beamline {
namespace {

class VerifyGraphsTest : public testing::BackendTest {};

TEST_P(VerifyGraphsTest, StepsOfDifferentSequenceCountsShareTheBucketsGraph) {
  if (!backend().supports_graphs()) GTEST_SKIP() << "the " << GetParam() << " backend records no graphs";
  backend().set_compute_dtype(ComputeDType::Float32);
  testing::TempDir dir("verify-graphs");
  const ModelConfig config = preset_config("tiny");
  const BeamWeights weights = testing::write_and_load(config, dir.path(), 13);
  BeamModel model(weights, backend());
  constexpr int32_t kSequences = 4, kPrompt = 6, kRows = 3, kSteps = 3;
  const int32_t block_size = default_block_size(config);
  const int32_t per_group = (kPrompt + kSteps * kRows + block_size - 1) / block_size;
  const KvCacheLayout layout = make_kv_cache_layout(config, block_size, kSequences * 4 * per_group);
  KvCache eager_cache(backend(), config, layout), graph_cache(backend(), config, layout);
  DecodeGraphs graphs(model, graph_cache, kSequences);

  // Sequence s owns blocks [(s * groups + g) * per_group, + per_group) of group g; `count` rows of each of the
  // first `sequences` sequences from their own position.
  std::vector<int32_t> fed(kSequences, 0);
  auto batch = [&](int32_t sequences, int32_t count, bool all_logits) {
    ForwardBatch step;
    for (int32_t s = 0; s < sequences; ++s) {
      SequenceSlice slice{s * count, (s + 1) * count, fed[static_cast<std::size_t>(s)], {}};
      for (int32_t g = 0; g < layout.num_groups(); ++g) {
        std::vector<int32_t>& table = slice.block_tables.emplace_back();
        for (int32_t b = 0; b < per_group; ++b) table.push_back((s * layout.num_groups() + g) * per_group + b);
      }
      step.sequences.push_back(slice);
      for (int32_t r = 0; r < count; ++r) {
        step.tokens.push_back((s * 131 + (slice.context_begin + r) * 17 + 5) % 500);
        if (all_logits || r + 1 == count) step.logit_rows.push_back(s * count + r);
      }
    }
    return step;
  };
  auto advance = [&](int32_t sequences, int32_t count) {
    for (int32_t s = 0; s < sequences; ++s) fed[static_cast<std::size_t>(s)] += count;
  };
  const ForwardBatch prompts = batch(kSequences, kPrompt, false);
  for (KvCache* cache : {&eager_cache, &graph_cache}) model.forward(prompts, *cache);
  advance(kSequences, kPrompt);
  for (const int32_t sequences : {3, 4, 3}) {
    const ForwardBatch step = batch(sequences, kRows, true);
    const std::vector<float> expected = backend().download_f32(model.forward(step, eager_cache));
    const std::optional<Tensor> replayed = graphs.forward(step);
    ASSERT_TRUE(replayed.has_value()) << "a verify step of " << sequences << " sequences was not taken by the graphs";
    testing::expect_close(backend().download_f32(*replayed), std::vector<double>(expected.begin(), expected.end()),
                          1e-4, fmt::format("verify logits of {} sequences", sequences));
    advance(sequences, kRows);
  }
  EXPECT_EQ(graphs.recorded(), 1) << "3 and 4 sequences of 3 rows each should share bucket 4's graph";
  EXPECT_EQ(graphs.replayed(), 2);
}

INSTANTIATE_TEST_SUITE_P(Backends, VerifyGraphsTest, ::testing::ValuesIn(testing::backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace beamline

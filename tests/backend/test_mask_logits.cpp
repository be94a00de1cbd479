// Backend::mask_logits (structured outputs' token masks) against a naive loop on random logits and random bitmasks
// (dense, sparse, all-ones and all-zero words, vocabularies that end inside a word, rows in any order and repeated
// rows left alone), exact on every backend: the op only writes -inf. The CUDA case runs where a device is present.
#include <limits>

#include "backend_test_support.h"
#include "util/error.h"

namespace beamline::testing {
namespace {

class MaskLogitsTest : public BackendTest {};

std::vector<uint32_t> random_mask(Random& random, int64_t words, int kind) {
  std::vector<uint32_t> mask(static_cast<std::size_t>(words));
  for (uint32_t& word : mask) {
    const uint32_t bits = static_cast<uint32_t>(random.engine()());
    switch (kind) {
      case 0: word = bits; break;                                           // dense
      case 1: word = bits & static_cast<uint32_t>(random.engine()()) & static_cast<uint32_t>(random.engine()()); break;
      case 2: word = random.integer(0, 3) == 0 ? bits : 0xFFFFFFFFu; break; // mostly allowed
      default: word = random.integer(0, 7) == 0 ? bits : 0u; break;         // mostly masked
    }
  }
  return mask;
}

TEST_P(MaskLogitsTest, MatchesTheNaiveLoop) {
  Random random(91);
  for (const int64_t vocab : {1, 31, 32, 33, 1000, 4099, 201088}) {
    const int64_t rows = 5, words = (vocab + 31) / 32 + (vocab % 3 == 0 ? 2 : 0);  // extra words are ignored
    std::vector<float> logits = random.normal(static_cast<std::size_t>(rows * vocab));
    const std::vector<int32_t> masked_rows = {3, 0, 4};  // rows 1 and 2 stay as they are
    std::vector<uint32_t> masks;
    for (std::size_t i = 0; i < masked_rows.size(); ++i) {
      const auto mask = random_mask(random, words, static_cast<int>(i + vocab) % 4);
      masks.insert(masks.end(), mask.begin(), mask.end());
    }
    Tensor device_logits = backend().upload_f32(logits, {rows, vocab});
    const Tensor allowed = backend().upload(masks.data(), DType::I32, {static_cast<int64_t>(masked_rows.size()), words});
    backend().mask_logits(device_logits, masked_rows, allowed);
    const std::vector<float> got = backend().download_f32(device_logits);
    std::vector<float> expected = logits;
    for (std::size_t i = 0; i < masked_rows.size(); ++i)
      for (int64_t t = 0; t < vocab; ++t)
        if (((masks[i * words + t / 32] >> (t % 32)) & 1u) == 0)
          expected[masked_rows[i] * vocab + t] = -std::numeric_limits<float>::infinity();
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t j = 0; j < got.size(); ++j)
      ASSERT_EQ(got[j], expected[j]) << "vocab " << vocab << " element " << j;
  }
}

TEST_P(MaskLogitsTest, MaskedRowsSampleOnlyAllowedTokens) {
  // What the runner does: mask, then Backend::sample at temperature 1 never picks a masked token.
  Random random(5);
  const int64_t vocab = 777, rows = 16, words = (vocab + 31) / 32;
  Tensor logits = backend().upload_f32(random.normal(static_cast<std::size_t>(rows * vocab), 3.0f), {rows, vocab});
  std::vector<int32_t> all_rows(rows);
  std::vector<uint32_t> masks;
  for (int64_t r = 0; r < rows; ++r) {
    all_rows[r] = static_cast<int32_t>(r);
    const auto mask = random_mask(random, words, 3);
    masks.insert(masks.end(), mask.begin(), mask.end());
    masks[r * words] |= 1u << 5;  // at least one token allowed per row
  }
  backend().mask_logits(logits, all_rows, backend().upload(masks.data(), DType::I32, {rows, words}));
  std::vector<SampleRow> settings(rows);
  for (int64_t r = 0; r < rows; ++r) {
    settings[r].logit_row = static_cast<int32_t>(r);
    settings[r].uniform = (r + 0.5) / rows;
  }
  SampleOutputs out;
  out.tokens = backend().alloc(DType::I32, {rows});
  backend().sample(logits, settings, out);
  const std::vector<int32_t> tokens = backend().download_i32(out.tokens);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_TRUE((masks[r * words + tokens[r] / 32] >> (tokens[r] % 32)) & 1u) << "row " << r << " token " << tokens[r];
}

TEST_P(MaskLogitsTest, BadArgumentsAreErrors) {
  Tensor logits = backend().upload_f32(std::vector<float>(2 * 40, 0.0f), {2, 40});
  const std::vector<uint32_t> one_word(2, ~0u);
  const Tensor short_mask = backend().upload(one_word.data(), DType::I32, {2, 1});  // 40 tokens need 2 words
  EXPECT_THROW(backend().mask_logits(logits, std::vector<int32_t>{0, 1}, short_mask), Error);
  const std::vector<uint32_t> two_words(4, ~0u);
  const Tensor mask = backend().upload(two_words.data(), DType::I32, {2, 2});
  EXPECT_THROW(backend().mask_logits(logits, std::vector<int32_t>{0, 2}, mask), Error);  // row out of range
  EXPECT_THROW(backend().mask_logits(logits, std::vector<int32_t>{0}, mask), Error);     // one row, two masks
}

INSTANTIATE_TEST_SUITE_P(Backends, MaskLogitsTest, ::testing::ValuesIn(backend_names()));

}  // namespace
}  // namespace beamline::testing

// Batch invariance (--batch-invariant, vLLM's VLLM_BATCH_INVARIANT): for each op on the forward path, a few probe rows
// are computed alone, then inside batches of 3, 9, 64 and 200 rows (random filler rows around them, the probes at
// random places), and every probe's outputs must be bit-identical to its outputs alone. Attention mixes decode rows
// and prefill chunks in one batch, and also holds a position computed as a decode row against the same position
// inside a prefill chunk. Each probe's outputs alone are also held against the reference backend, so the invariant
// kernels are checked for being right as well as for being stable. Run with `backend_ops test --batch-invariant
// --filter batch_invariance` (the backend under test is put in batch-invariant mode; the cpu backend always is).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "kv/kv_cache_layout.h"
#include "op_families.h"
#include "sampling/sampling.h"

namespace beamline::backend_ops {
namespace {

constexpr int64_t kProbes = 4;
constexpr int64_t kFillers = 64;  // filler rows (drawn with repetition) in each op's pool of inputs
const std::vector<int64_t> kBatchRows{3, 9, 64, 200};

// Runs one op on `backend` over the pool entries `batch` (in that order: one or more rows each) and returns each
// entry's outputs, `width` floats per entry.
using RunRows = std::function<std::vector<float>(Backend& backend, const std::vector<int64_t>& batch)>;

struct InvarianceCase {
  std::string op, shape;
  int64_t width = 0;        // outputs per pool entry
  double tolerance = 0.0;   // of the probes alone against the reference; < 0: not compared (decisions, not values)
  std::vector<int64_t> batch_rows = kBatchRows;
  RunRows run;
};

// Entries of one batch of `rows` entries: the probes (as many as fit) at random places, fillers elsewhere.
std::vector<int64_t> batch_with_probes(std::mt19937_64& rng, int64_t rows) {
  std::vector<int64_t> batch(static_cast<std::size_t>(rows));
  std::uniform_int_distribution<int64_t> filler(kProbes, kProbes + kFillers - 1);
  for (int64_t& entry : batch) entry = filler(rng);
  std::vector<int64_t> places(static_cast<std::size_t>(rows));
  std::iota(places.begin(), places.end(), 0);
  std::shuffle(places.begin(), places.end(), rng);
  for (int64_t p = 0; p < std::min(kProbes, rows); ++p) batch[static_cast<std::size_t>(places[static_cast<std::size_t>(p)])] = p;
  return batch;
}

int64_t differing_floats(const float* a, const float* b, int64_t n) {
  int64_t differing = 0;
  for (int64_t i = 0; i < n; ++i) differing += std::memcmp(a + i, b + i, sizeof(float)) != 0;
  return differing;
}

void check_case(Harness& harness, const InvarianceCase& c) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> alone(kProbes);
  for (int64_t p = 0; p < kProbes; ++p) alone[static_cast<std::size_t>(p)] = c.run(harness.device(), {p});
  if (c.tolerance >= 0.0) {
    std::vector<float> device, reference;
    for (int64_t p = 0; p < kProbes; ++p) {
      const std::vector<float>& mine = alone[static_cast<std::size_t>(p)];
      device.insert(device.end(), mine.begin(), mine.end());
      const std::vector<float> theirs = c.run(harness.reference(), {p});
      reference.insert(reference.end(), theirs.begin(), theirs.end());
    }
    const double error = relative_error(device, reference);
    harness.record_result(Result{c.op, c.shape + ", probes alone vs reference", error, c.tolerance, {},
                                 error <= c.tolerance, seconds_since(start)});
  }
  for (int64_t rows : c.batch_rows) {
    const auto batch_start = std::chrono::steady_clock::now();
    const std::vector<int64_t> batch = batch_with_probes(harness.inputs().rng(), rows);
    const std::vector<float> outputs = c.run(harness.device(), batch);
    int64_t differing = 0, probes = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (batch[i] >= kProbes) continue;
      ++probes;
      differing += differing_floats(outputs.data() + static_cast<int64_t>(i) * c.width,
                                    alone[static_cast<std::size_t>(batch[i])].data(), c.width);
    }
    harness.record_result(Result{c.op, fmt::format("{}, {} probe(s) in a batch of {}", c.shape, probes, rows),
                                 static_cast<double>(differing), 0.0, "outputs differing from alone, bit for bit",
                                 differing == 0, seconds_since(batch_start)});
  }
}

// Rows of a pool [entries, width] gathered in batch order.
std::vector<float> gather(const std::vector<float>& pool, int64_t width, const std::vector<int64_t>& batch) {
  std::vector<float> rows;
  rows.reserve(batch.size() * static_cast<std::size_t>(width));
  for (int64_t entry : batch) rows.insert(rows.end(), pool.begin() + entry * width, pool.begin() + (entry + 1) * width);
  return rows;
}

int64_t pool_size() { return kProbes + kFillers; }

void linear_cases(Harness& harness, std::vector<InvarianceCase>& cases) {
  struct Shape {
    int64_t in, out;
    DType dtype;
    const char* what;
  };
  std::vector<Shape> shapes{{520, 136, DType::BF16, "BF16"}, {77, 40, DType::BF16, "BF16, in not a multiple of 8"},
                            {264, 33, DType::F16, "F16"}, {96, 24, DType::F32, "F32"}};
  if (!harness.small_only()) shapes.push_back({5120, 1024, DType::BF16, "Beam-1.0 k"});
  for (const Shape& s : shapes) {
    auto weight = harness.random_weight(s.dtype, {s.out, s.in}, 1.0f / std::sqrt(static_cast<float>(s.in)));
    const std::vector<float> x = harness.inputs().uniform(pool_size() * s.in);
    cases.push_back({"linear", fmt::format("{}x{} {}", s.out, s.in, s.what), s.out, kF32Tolerance, kBatchRows,
                     [&harness, weight, x, s](Backend& backend, const std::vector<int64_t>& batch) {
                       const auto rows = static_cast<int64_t>(batch.size());
                       Tensor y = backend.alloc(DType::F32, {rows, s.out});
                       const Tensor& w = &backend == &harness.device() ? weight.device : weight.reference;
                       backend.linear(backend.upload_f32(gather(x, s.in, batch), {rows, s.in}), {w, {}, {}}, y);
                       return backend.download_f32(y);
                     }});
  }
  // q|k|v in one call.
  const int64_t in = 256;
  const std::vector<int64_t> outs{128, 32, 32};
  std::vector<Harness::Pair> weights;
  for (int64_t out : outs) weights.push_back(harness.random_weight(DType::BF16, {out, in}, 1.0f / 16.0f));
  const std::vector<float> x = harness.inputs().uniform(pool_size() * in);
  cases.push_back({"linear_many", "q|k|v 128|32|32 x 256 BF16", 192, kF32Tolerance, kBatchRows,
                   [&harness, weights, x, outs, in](Backend& backend, const std::vector<int64_t>& batch) {
                     const auto rows = static_cast<int64_t>(batch.size());
                     const bool device = &backend == &harness.device();
                     std::vector<LinearTensors> tensors;
                     std::vector<Tensor> ys;
                     for (std::size_t i = 0; i < outs.size(); ++i) {
                       tensors.push_back({device ? weights[i].device : weights[i].reference, {}, {}});
                       ys.push_back(backend.alloc(DType::F32, {rows, outs[i]}));
                     }
                     std::vector<const LinearTensors*> weight_list;
                     std::vector<Tensor*> y_list;
                     for (std::size_t i = 0; i < outs.size(); ++i) {
                       weight_list.push_back(&tensors[i]);
                       y_list.push_back(&ys[i]);
                     }
                     backend.linear_many(backend.upload_f32(gather(x, in, batch), {rows, in}), weight_list, y_list);
                     std::vector<std::vector<float>> parts;
                     for (const Tensor& y : ys) parts.push_back(backend.download_f32(y));
                     std::vector<float> joined;
                     for (int64_t r = 0; r < rows; ++r)
                       for (std::size_t i = 0; i < outs.size(); ++i)
                         joined.insert(joined.end(), parts[i].begin() + r * outs[i], parts[i].begin() + (r + 1) * outs[i]);
                     return joined;
                   }});
}

void mlp_cases(Harness& harness, std::vector<InvarianceCase>& cases) {
  // The dense SwiGLU.
  const int64_t hidden = 256, intermediate = 136;
  auto gate = harness.random_weight(DType::BF16, {intermediate, hidden}, 1.0f / 16.0f);
  auto up = harness.random_weight(DType::BF16, {intermediate, hidden}, 1.0f / 16.0f);
  auto down = harness.random_weight(DType::BF16, {hidden, intermediate}, 1.0f / std::sqrt(136.0f));
  const std::vector<float> h = harness.inputs().uniform(pool_size() * hidden);
  cases.push_back({"swiglu", "H 256 I 136 BF16", hidden, kF32Tolerance, kBatchRows,
                   [&harness, gate, up, down, h, hidden](Backend& backend, const std::vector<int64_t>& batch) {
                     const auto rows = static_cast<int64_t>(batch.size());
                     const bool device = &backend == &harness.device();
                     auto pick = [device](const Harness::Pair& pair) { return device ? pair.device : pair.reference; };
                     SwigluTensors mlp{{pick(gate), {}, {}}, {pick(up), {}, {}}, {pick(down), {}, {}}};
                     Tensor out = backend.alloc(DType::F32, {rows, hidden});
                     backend.swiglu(backend.upload_f32(gather(h, hidden, batch), {rows, hidden}), mlp, out);
                     return backend.download_f32(out);
                   }});

  // The routed experts: each pool token with its own routing; 300 rows at top 8 (2400 slots) cross the streaming
  // kernels' 2048-slot calls.
  struct Shape {
    int64_t hidden, intermediate;
    int32_t experts, top_k;
    std::vector<int64_t> batch_rows;
  };
  std::vector<Shape> shapes{{256, 128, 16, 4, kBatchRows}, {200, 72, 64, 8, {3, 9, 64, 200, 300}}};
  for (const Shape& s : shapes) {
    const ExpertPair stack = random_experts(harness, s.experts, s.experts, s.hidden, s.intermediate);
    const MoeTensors device_moe = stack.device, reference_moe = stack.reference;
    const auto assignment = random_assignment(harness.inputs(), pool_size(), s.experts, s.top_k);
    const std::vector<int32_t> ids = assignment.first;
    const std::vector<float> weights = assignment.second;
    const std::vector<float> h = harness.inputs().uniform(pool_size() * s.hidden);
    cases.push_back(
        {"moe", fmt::format("H {} E {}x{} top {} BF16", s.hidden, s.experts, s.intermediate, s.top_k), s.hidden,
         kF32Tolerance, s.batch_rows,
         [&harness, device_moe, reference_moe, ids, weights, h, s](Backend& backend, const std::vector<int64_t>& batch) {
           const auto rows = static_cast<int64_t>(batch.size());
           std::vector<int32_t> batch_ids;
           for (int64_t entry : batch)
             batch_ids.insert(batch_ids.end(), ids.begin() + entry * s.top_k, ids.begin() + (entry + 1) * s.top_k);
           Tensor out = backend.alloc(DType::F32, {rows, s.hidden});
           backend.moe(backend.upload_f32(gather(h, s.hidden, batch), {rows, s.hidden}),
                       backend.upload_i32(batch_ids, {rows, s.top_k}),
                       backend.upload_f32(gather(weights, s.top_k, batch), {rows, s.top_k}),
                       &backend == &harness.device() ? device_moe : reference_moe, out);
           return backend.download_f32(out);
         }});
  }

  // The router: ids (as floats: a different id is far off) and weights of each row.
  const int64_t router_hidden = 512;
  const int32_t experts = 64;
  const RouterParams params{8, 4, 8, true, 2.5f};
  auto router = harness.f32(harness.inputs().uniform(int64_t{experts} * router_hidden, 0.05f), {experts, router_hidden});
  auto bias = harness.f32(harness.inputs().uniform(experts, 0.01f), {experts});
  const std::vector<float> x = harness.inputs().uniform(pool_size() * router_hidden);
  cases.push_back({"route", "E 64 H 512 groups 8/4 top 8", 2 * params.top_k, kF32Tolerance, kBatchRows,
                   [&harness, router, bias, x, params, router_hidden](Backend& backend, const std::vector<int64_t>& batch) {
                     const auto rows = static_cast<int64_t>(batch.size());
                     const bool device = &backend == &harness.device();
                     Tensor ids = backend.alloc(DType::I32, {rows, params.top_k});
                     Tensor weights = backend.alloc(DType::F32, {rows, params.top_k});
                     backend.route(backend.upload_f32(gather(x, router_hidden, batch), {rows, router_hidden}),
                                   device ? router.device : router.reference, device ? bias.device : bias.reference,
                                   params, ids, weights);
                     const std::vector<int32_t> id_values = backend.download_i32(ids);
                     const std::vector<float> weight_values = backend.download_f32(weights);
                     std::vector<float> joined;
                     for (int64_t r = 0; r < rows; ++r) {
                       for (int32_t j = 0; j < params.top_k; ++j)
                         joined.push_back(static_cast<float>(id_values[static_cast<std::size_t>(r * params.top_k + j)]));
                       joined.insert(joined.end(), weight_values.begin() + r * params.top_k,
                                     weight_values.begin() + (r + 1) * params.top_k);
                     }
                     return joined;
                   }});

  // The norms before the router and the router as one op (on cuda, one launch at one row outside this mode): the
  // residual, the normed row, ids and weights of each row.
  auto weight = harness.random_weight(DType::BF16, {router_hidden}, 1.0f);
  auto next = harness.random_weight(DType::BF16, {router_hidden}, 1.0f);
  const std::vector<float> residual = harness.inputs().uniform(pool_size() * router_hidden);
  cases.push_back(
      {"add_rms_norm_then_route", "E 64 H 512 BF16 norms", 2 * router_hidden + 2 * params.top_k, kF32Tolerance,
       {1, 3, 9, 64},  // 1: the row that would be folded outside this mode
       [&harness, router, bias, x, params, router_hidden, weight, next, residual](Backend& backend,
                                                                                   const std::vector<int64_t>& batch) {
         const auto rows = static_cast<int64_t>(batch.size());
         const bool device = &backend == &harness.device();
         Tensor r = backend.upload_f32(gather(residual, router_hidden, batch), {rows, router_hidden});
         Tensor out = backend.alloc(DType::F32, {rows, router_hidden});
         Tensor ids = backend.alloc(DType::I32, {rows, params.top_k});
         Tensor weights = backend.alloc(DType::F32, {rows, params.top_k});
         backend.add_rms_norm_then_route(r, backend.upload_f32(gather(x, router_hidden, batch), {rows, router_hidden}),
                                         device ? weight.device : weight.reference, 1e-6f, 0.5f,
                                         device ? next.device : next.reference, out,
                                         device ? router.device : router.reference,
                                         device ? bias.device : bias.reference, params, ids, weights);
         const std::vector<float> sums = backend.download_f32(r), normed = backend.download_f32(out);
         const std::vector<int32_t> id_values = backend.download_i32(ids);
         const std::vector<float> weight_values = backend.download_f32(weights);
         std::vector<float> joined;
         for (int64_t i = 0; i < rows; ++i) {
           joined.insert(joined.end(), sums.begin() + i * router_hidden, sums.begin() + (i + 1) * router_hidden);
           joined.insert(joined.end(), normed.begin() + i * router_hidden, normed.begin() + (i + 1) * router_hidden);
           for (int32_t j = 0; j < params.top_k; ++j)
             joined.push_back(static_cast<float>(id_values[static_cast<std::size_t>(i * params.top_k + j)]));
           joined.insert(joined.end(), weight_values.begin() + i * params.top_k,
                         weight_values.begin() + (i + 1) * params.top_k);
         }
         return joined;
       }});
}

void row_cases(Harness& harness, std::vector<InvarianceCase>& cases) {
  // The sandwich norm's residual add and the next norm: the residual and the normed row, per row.
  const int64_t hidden = 520;
  auto weight = harness.random_weight(DType::BF16, {hidden}, 1.0f);
  auto next = harness.random_weight(DType::BF16, {hidden}, 1.0f);
  const std::vector<float> residual = harness.inputs().uniform(pool_size() * hidden);
  const std::vector<float> y = harness.inputs().uniform(pool_size() * hidden);
  cases.push_back({"add_rms_norm_then_norm", "H 520 BF16 weights", 2 * hidden, kF32Tolerance, kBatchRows,
                   [&harness, weight, next, residual, y, hidden](Backend& backend, const std::vector<int64_t>& batch) {
                     const auto rows = static_cast<int64_t>(batch.size());
                     const bool device = &backend == &harness.device();
                     Tensor r = backend.upload_f32(gather(residual, hidden, batch), {rows, hidden});
                     Tensor out = backend.alloc(DType::F32, {rows, hidden});
                     backend.add_rms_norm_then_norm(r, backend.upload_f32(gather(y, hidden, batch), {rows, hidden}),
                                                    device ? weight.device : weight.reference, 1e-6f, 0.5f,
                                                    device ? next.device : next.reference, out);
                     const std::vector<float> sums = backend.download_f32(r), normed = backend.download_f32(out);
                     std::vector<float> joined;
                     for (int64_t i = 0; i < rows; ++i) {
                       joined.insert(joined.end(), sums.begin() + i * hidden, sums.begin() + (i + 1) * hidden);
                       joined.insert(joined.end(), normed.begin() + i * hidden, normed.begin() + (i + 1) * hidden);
                     }
                     return joined;
                   }});

  // The LM head (norm, projection, soft cap) over every row of the batch.
  const int64_t model = 96, vocab = 1003;
  auto norm = harness.random_weight(DType::BF16, {model}, 1.0f);
  auto head = harness.random_weight(DType::BF16, {vocab, model}, 1.0f / std::sqrt(96.0f));
  const std::vector<float> x = harness.inputs().uniform(pool_size() * model);
  cases.push_back({"lm_head", "V 1003 H 96 softcap 30 BF16", vocab, kF32Tolerance, kBatchRows,
                   [&harness, norm, head, x, model, vocab](Backend& backend, const std::vector<int64_t>& batch) {
                     const auto rows = static_cast<int64_t>(batch.size());
                     const bool device = &backend == &harness.device();
                     std::vector<int32_t> all(static_cast<std::size_t>(rows));
                     std::iota(all.begin(), all.end(), 0);
                     Tensor logits = backend.alloc(DType::F32, {rows, vocab});
                     backend.lm_head(backend.upload_f32(gather(x, model, batch), {rows, model}),
                                     backend.upload_i32(all, {rows}), device ? norm.device : norm.reference, 1e-6f,
                                     {device ? head.device : head.reference, {}, {}}, 30.0f, logits);
                     return backend.download_f32(logits);
                   }});

  // Sampling with logprobs over Beam's vocabulary (wide enough for a cluster of blocks per row): greedy rows and
  // filtered draws; token, logprob, rank and the top 5, per row. Decisions: compared bit for bit only.
  const int64_t beam_vocab = 201088, top = 5;
  const int64_t sample_vocab = harness.small_only() ? 4099 : beam_vocab;
  std::vector<float> logits = harness.inputs().uniform(pool_size() * sample_vocab, 8.0f);
  std::vector<SampleRow> settings(static_cast<std::size_t>(pool_size()));
  std::uniform_real_distribution<double> draw(0.0, 1.0);
  for (std::size_t i = 0; i < settings.size(); ++i) {
    SampleRow& row = settings[i];
    row.greedy = i % 3 == 0;
    row.temperature = 0.7f;
    row.top_k = i % 3 == 1 ? 50 : 0;
    row.top_p = i % 3 == 2 ? 0.9f : 1.0f;
    row.uniform = draw(harness.inputs().rng());
    row.num_logprobs = static_cast<int32_t>(top);
  }
  cases.push_back(
      {"sample", fmt::format("V {} greedy, top-k 50, top-p 0.9, logprobs {}", sample_vocab, top), 3 + 2 * top, -1.0,
       kBatchRows, [logits, settings, sample_vocab, top](Backend& backend, const std::vector<int64_t>& batch) {
         const auto rows = static_cast<int64_t>(batch.size());
         std::vector<SampleRow> batch_rows;
         for (std::size_t i = 0; i < batch.size(); ++i) {
           batch_rows.push_back(settings[static_cast<std::size_t>(batch[i])]);
           batch_rows.back().logit_row = static_cast<int32_t>(i);
         }
         SampleOutputs out{backend.alloc(DType::I32, {rows}), backend.alloc(DType::F32, {rows}),
                           backend.alloc(DType::I32, {rows}), backend.alloc(DType::I32, {rows, top}),
                           backend.alloc(DType::F32, {rows, top})};
         backend.sample(backend.upload_f32(gather(logits, sample_vocab, batch), {rows, sample_vocab}), batch_rows, out);
         const std::vector<int32_t> tokens = backend.download_i32(out.tokens), ranks = backend.download_i32(out.ranks),
                                    top_ids = backend.download_i32(out.top_ids);
         const std::vector<float> logprobs = backend.download_f32(out.logprobs),
                                  top_logprobs = backend.download_f32(out.top_logprobs);
         std::vector<float> joined;
         for (int64_t r = 0; r < rows; ++r) {
           joined.push_back(static_cast<float>(tokens[static_cast<std::size_t>(r)]));
           joined.push_back(logprobs[static_cast<std::size_t>(r)]);
           joined.push_back(static_cast<float>(ranks[static_cast<std::size_t>(r)]));
           for (int64_t k = 0; k < top; ++k) {
             joined.push_back(static_cast<float>(top_ids[static_cast<std::size_t>(r * top + k)]));
             joined.push_back(top_logprobs[static_cast<std::size_t>(r * top + k)]);
           }
         }
         return joined;
       }});
}

// Paged attention. Pool entries are (sequence, length, query rows): the probes are a decode row late in a long
// sequence, a 37-row prefill chunk, a 5-row chunk (past the decode kernel's 4) and, for the sequence of the 37-row
// chunk, its 20th row as a decode row on its own; fillers are decode rows and prefill chunks of random lengths.
// Every sequence's keys and values are written once; each batch reads them through its own block table.
struct AttentionEntry {
  int32_t sequence, length, queries;
};

void attention_cases(Harness& harness, std::vector<InvarianceCase>& cases) {
  struct Shape {
    int32_t heads, kv_heads, dim, window, block_size;
    DType pool_dtype;
    const char* what;
  };
  const std::vector<Shape> shapes{{8, 2, 128, 0, 16, DType::BF16, "causal, BF16 pool"},
                                  {8, 2, 128, 64, 16, DType::BF16, "window 64, BF16 pool"},
                                  {4, 4, 64, 0, 32, DType::F32, "causal, F32 pool"}};
  for (const Shape& s : shapes) {
    std::mt19937_64& rng = harness.inputs().rng();
    std::vector<AttentionEntry> entries{{0, 900, 1}, {1, 300, 37}, {2, 77, 5}, {1, 300 - 37 + 20, 1}};
    std::vector<int32_t> lengths{900, 300, 77};
    for (int64_t f = 0; f < kFillers; ++f) {
      const bool decode = f % 2 == 0;
      const int32_t queries = decode ? 1 : std::uniform_int_distribution<int32_t>(2, 40)(rng);
      const int32_t length = queries + std::uniform_int_distribution<int32_t>(0, 400)(rng);
      entries.push_back({static_cast<int32_t>(lengths.size()), length, queries});
      lengths.push_back(length);
    }
    const int64_t width = int64_t{s.kv_heads} * s.dim, q_width = int64_t{s.heads} * s.dim;
    // Every sequence in its own blocks, shuffled over the pool.
    int32_t total_blocks = 0, max_blocks = 0;
    for (int32_t length : lengths) {
      const int32_t blocks = (length + s.block_size - 1) / s.block_size;
      total_blocks += blocks;
      max_blocks = std::max(max_blocks, blocks);
    }
    std::vector<int32_t> order(static_cast<std::size_t>(total_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::vector<int32_t>> tables;
    std::size_t next = 0;
    for (int32_t length : lengths) {
      tables.emplace_back();
      for (int32_t b = 0; b * s.block_size < length; ++b) tables.back().push_back(order[next++]);
    }
    const std::vector<int64_t> pool_shape{total_blocks, 1, s.block_size, s.kv_heads, s.dim};
    auto pools = std::make_shared<std::array<PagedKvPool, 2>>();
    (*pools)[0] = {harness.device().alloc(s.pool_dtype, pool_shape), harness.device().alloc(s.pool_dtype, pool_shape)};
    (*pools)[1] = {harness.reference().alloc(s.pool_dtype, pool_shape),
                   harness.reference().alloc(s.pool_dtype, pool_shape)};
    for (Backend* backend : {&harness.device(), &harness.reference()}) {
      PagedKvPool& pool = (*pools)[backend == &harness.device() ? 0 : 1];
      backend->fill_zero(pool.k);
      backend->fill_zero(pool.v);
    }
    // Write every position of every sequence (both backends, the same values).
    for (std::size_t q = 0; q < lengths.size(); ++q) {
      const int32_t length = lengths[q];
      const std::vector<float> k = harness.inputs().uniform(length * width), v = harness.inputs().uniform(length * width);
      std::vector<int32_t> positions(static_cast<std::size_t>(length));
      std::iota(positions.begin(), positions.end(), 0);
      for (Backend* backend : {&harness.device(), &harness.reference()}) {
        PagedKvPool& pool = (*pools)[backend == &harness.device() ? 0 : 1];
        const AttentionBatch batch = backend->make_attention_batch(positions, {0, length}, {length});
        backend->write_kv(backend->upload_f32(k, {length, width}), backend->upload_f32(v, {length, width}), pool, 0,
                          backend->upload_i32(tables[q], {1, static_cast<int64_t>(tables[q].size())}), batch);
      }
    }
    // Queries: each entry's rows; the lone decode row of probe 3 is row 20 of probe 1's chunk.
    std::vector<std::vector<float>> queries;
    for (const AttentionEntry& entry : entries) queries.push_back(harness.inputs().uniform(entry.queries * q_width));
    queries[3].assign(queries[1].begin() + 19 * q_width, queries[1].begin() + 20 * q_width);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
    int32_t most_queries = 0;
    for (const AttentionEntry& entry : entries) most_queries = std::max(most_queries, entry.queries);
    // Entries have different row counts: each is padded to the longest one's outputs (zeros past its rows).
    const int64_t entry_width = int64_t{most_queries} * q_width;
    auto run = [&harness, pools, entries, tables, queries, s, q_width, entry_width, max_blocks, scale](
                   Backend& backend, const std::vector<int64_t>& batch) {
      std::vector<int32_t> positions, query_start{0}, seq_lens, table;
      std::vector<float> q;
      for (int64_t index : batch) {
        const AttentionEntry& entry = entries[static_cast<std::size_t>(index)];
        for (int32_t p = entry.length - entry.queries; p < entry.length; ++p) positions.push_back(p);
        query_start.push_back(static_cast<int32_t>(positions.size()));
        seq_lens.push_back(entry.length);
        std::vector<int32_t> row = tables[static_cast<std::size_t>(entry.sequence)];
        row.resize(static_cast<std::size_t>(max_blocks), kNullBlock);
        table.insert(table.end(), row.begin(), row.end());
        q.insert(q.end(), queries[static_cast<std::size_t>(index)].begin(), queries[static_cast<std::size_t>(index)].end());
      }
      const auto rows = static_cast<int64_t>(positions.size());
      const AttentionBatch attention = backend.make_attention_batch(positions, query_start, seq_lens);
      AttentionParams params;
      params.num_heads = s.heads;
      params.num_kv_heads = s.kv_heads;
      params.head_dim = s.dim;
      params.scale = scale;
      params.sliding_window = s.window;
      Tensor out = backend.alloc(DType::F32, {rows, q_width});
      backend.paged_attention(backend.upload_f32(q, {rows, q_width}), (*pools)[&backend == &harness.device() ? 0 : 1],
                              backend.upload_i32(table, {static_cast<int64_t>(batch.size()), max_blocks}), attention,
                              params, out);
      const std::vector<float> rows_out = backend.download_f32(out);
      std::vector<float> padded(batch.size() * static_cast<std::size_t>(entry_width), 0.0f);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const int64_t first = query_start[i] * q_width, count = (query_start[i + 1] - query_start[i]) * q_width;
        std::copy_n(rows_out.begin() + first, count, padded.begin() + static_cast<int64_t>(i) * entry_width);
      }
      return padded;
    };
    const std::string shape = fmt::format("{} heads / {} kv, D {}, {} blocks ({}), decode rows and prefill chunks",
                                          s.heads, s.kv_heads, s.dim, s.block_size, s.what);
    cases.push_back({"attention", shape, entry_width, kF32Tolerance, kBatchRows, run});
    // The same position as a decode row and inside a prefill chunk.
    const auto start = std::chrono::steady_clock::now();
    const std::vector<float> chunk = run(harness.device(), {1}), lone = run(harness.device(), {3});
    const int64_t differing = differing_floats(chunk.data() + 19 * q_width, lone.data(), q_width);
    harness.record_result(Result{"attention", shape.substr(0, shape.find(", decode")) +
                                                  ", position 282 as a decode row vs row 20 of a 37-row prefill chunk",
                                 static_cast<double>(differing), 0.0, "outputs differing, bit for bit", differing == 0,
                                 seconds_since(start)});
  }
}

}  // namespace

void test_batch_invariance(Harness& harness) {
  std::vector<InvarianceCase> cases;
  linear_cases(harness, cases);
  mlp_cases(harness, cases);
  row_cases(harness, cases);
  attention_cases(harness, cases);
  for (const InvarianceCase& c : cases) check_case(harness, c);
}

}  // namespace beamline::backend_ops

#include "runner/decode_graphs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <set>

#include "backend/record_graph.h"
#include "util/error.h"

namespace beamline {

DecodeGraphs::DecodeGraphs(BeamModel& model, KvCache& cache, int32_t max_batch, bool capture_routed_experts)
    : model_(model), cache_(cache), capture_routed_experts_(capture_routed_experts) {
  require(max_batch >= 1, "decode graphs: max_batch {} must be at least 1", max_batch);
  max_batch = std::min(max_batch, kMaxBucket);
  // vLLM's spacing: every small size, then steps of about a third, so padding wastes at most ~a third of a step.
  for (int32_t size : {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512})
    if (size < max_batch) buckets_.push_back(size);
  buckets_.push_back(max_batch);
}

int32_t DecodeGraphs::bucket(int32_t sequences) const {
  const auto found = std::lower_bound(buckets_.begin(), buckets_.end(), sequences);
  return found == buckets_.end() ? 0 : *found;
}

std::optional<std::string> DecodeGraphs::key(const BeamModel::StepInputs& inputs) const {
  // Sequences and rows both: a verify step's rows (1 + k per sequence) can equal another bucket's.
  // LoRA ops run only in steps where some row has an adapter (StepInputs::any_lora).
  std::string key = fmt::format("{}x{}|{}{}", inputs.attention.num_sequences(), inputs.rows,
                                fmt::join(inputs.table_widths, ","), inputs.any_lora ? "|lora" : "");
  std::set<int32_t> windows;
  for (std::size_t layer = 0; layer < model_.num_layers(); ++layer) {
    const AttentionParams params = model_.attention_params(layer, cache_.layout());
    if (!windows.insert(params.sliding_window).second) continue;
    const std::optional<std::string> plan =
        model_.backend().attention_signature(inputs.attention, cache_.pool(), params);
    if (!plan) return std::nullopt;
    key += fmt::format("|{}:{}", params.sliding_window, *plan);
  }
  return key;
}

std::optional<Tensor> DecodeGraphs::forward(const ForwardBatch& batch, const Tensor& token_source,
                                            Tensor* routed_experts, Tensor* captured_hidden) {
  const auto sequences = static_cast<int32_t>(batch.sequences.size());
  if (sequences == 0) return std::nullopt;
  // Every sequence the same number of rows (one; or 1 + k with k draft tokens each, a verify step), every row a logit
  // row, in order.
  const int32_t rows_per_sequence = batch.sequences[0].token_end - batch.sequences[0].token_begin;
  const auto rows = static_cast<int32_t>(batch.tokens.size());
  if (rows_per_sequence < 1 || rows != sequences * rows_per_sequence || batch.logit_rows.size() != batch.tokens.size())
    return std::nullopt;
  for (const SequenceSlice& sequence : batch.sequences)
    if (sequence.token_end - sequence.token_begin != rows_per_sequence) return std::nullopt;
  for (int32_t r = 0; r < rows; ++r)
    if (batch.logit_rows[static_cast<std::size_t>(r)] != r) return std::nullopt;
  const int32_t padded = bucket(sequences);
  if (padded == 0) return std::nullopt;

  std::vector<int64_t> widths;
  for (int32_t group = 0; group < cache_.layout().num_groups(); ++group) {
    std::size_t width = 1;
    for (const SequenceSlice& sequence : batch.sequences) width = std::max(width, sequence.block_tables[group].size());
    widths.push_back(static_cast<int64_t>(std::bit_ceil(width)));
  }
  // Padding sequences carry as many rows as the real ones: the key is then (bucket, rows per sequence), not the real
  // count. With one-row padding a verify step of 15 sequences and one of 14 had different rows (8 * 15 + 1 against
  // 8 * 14 + 2), so every count recorded a graph of its own: up to 64 recordings (each an op-by-op pass, a capture and
  // an instantiation) for the counts of one batch of 64, past the LRU's 48 (bench/results/2026-12-03-spec15.md).
  BeamModel::StepInputs inputs = model_.prepare(batch, cache_.layout(), padded, widths, rows_per_sequence);
  const std::optional<std::string> graph_key = key(inputs);
  if (!graph_key) return std::nullopt;

  Backend& backend = model_.backend();
  auto found = graphs_.find(*graph_key);
  if (found == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
        return a.second.last_used < b.second.last_used;
      }));
    }
    Graph graph;
    graph.inputs = std::move(inputs);
    model_.upload(graph.inputs);
    model_.place_deferred_tokens(batch, token_source, graph.inputs.tokens);
    if (capture_routed_experts_)
      graph.routed_experts = backend.alloc(
          DType::I32, {model_.num_moe_layers(), graph.inputs.rows, model_.config().num_experts_per_tok});
    // This step runs op by op first: what ops make lazily on the device (weight pointer tables, cuBLAS's plans) then
    // exists before the recording, which must not upload. Recording runs nothing, so the KV is written once (and the
    // routing of this step is the op-by-op run's, in the same buffer).
    const Tensor logits = model_.run(graph.inputs, cache_, graph.routed_experts);
    const Tensor eager_captured = model_.captured_hidden();  // this step's; the graph's buffer is written on replay
    graph.graph = record_graph(backend, [&] { graph.logits = model_.run(graph.inputs, cache_, graph.routed_experts); });
    graph.captured_hidden = model_.captured_hidden();
    graph.last_used = ++steps_;
    if (captured_hidden != nullptr) *captured_hidden = eager_captured;
    if (routed_experts != nullptr && batch.capture_routed_experts) *routed_experts = graph.routed_experts;
    graphs_.emplace(*graph_key, std::move(graph));
    ++recorded_;
    spdlog::debug("decode graphs: recorded {} ({} graphs)", *graph_key, graphs_.size());
    return logits.view(0, {rows, logits.dim(1)});
  }
  require(found->second.inputs.packed.size() == inputs.packed.size(),
          "decode graphs: inputs of {} values for a graph recorded with {}", inputs.packed.size(),
          found->second.inputs.packed.size());
  Graph& graph = found->second;
  backend.copy_to(graph.inputs.device, inputs.packed.data());
  model_.place_deferred_tokens(batch, token_source, graph.inputs.tokens);
  ++replayed_;
  graph.last_used = ++steps_;
  backend.replay(*graph.graph);
  if (captured_hidden != nullptr) *captured_hidden = graph.captured_hidden;
  if (routed_experts != nullptr && batch.capture_routed_experts) *routed_experts = graph.routed_experts;
  return graph.logits.view(0, {rows, graph.logits.dim(1)});
}

}  // namespace beamline

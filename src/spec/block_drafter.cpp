#include "spec/block_drafter.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "backend/record_graph.h"
#include "util/error.h"

namespace beamline {

class BlockDrafter::PackedInts {
 public:
  std::size_t add(std::span<const int32_t> values) {
    offsets_.push_back(values_.size());
    values_.insert(values_.end(), values.begin(), values.end());
    return offsets_.size() - 1;
  }
  // An AttentionBatch's four index tensors, to be attached once uploaded.
  std::array<std::size_t, 4> add(const AttentionBatch& batch) {
    return {add(batch.host_positions), add(batch.host_row_sequence), add(batch.host_query_start),
            add(batch.host_seq_lens)};
  }
  void upload(Backend& backend) {
    device_ = backend.upload_i32(values_, {static_cast<int64_t>(values_.size())});
  }
  // Into `device` (a recorded graph's input buffer, as large), which the views then read.
  void copy_to(Backend& backend, Tensor device) {
    require(device.numel() == static_cast<int64_t>(values_.size()),
            "block drafter: {} index values for a graph recorded with {}", values_.size(), device.numel());
    backend.copy_to(device, values_.data());
    device_ = std::move(device);
  }
  const Tensor& device() const { return device_; }
  Tensor view(std::size_t part, std::vector<int64_t> shape) const {
    return device_.view(static_cast<int64_t>(offsets_.at(part)), std::move(shape));
  }
  void attach(const std::array<std::size_t, 4>& parts, AttentionBatch& batch) const {
    const int64_t rows = batch.num_rows(), sequences = batch.num_sequences();
    batch.positions = view(parts[0], {rows});
    batch.row_sequence = view(parts[1], {rows});
    batch.query_start = view(parts[2], {sequences + 1});
    batch.seq_lens = view(parts[3], {sequences});
  }

 private:
  std::vector<int32_t> values_;
  std::vector<std::size_t> offsets_;
  Tensor device_;
};

namespace {

Tensor load(Backend& backend, const SafetensorsArchive& archive, const std::string& name) {
  return backend.load_weight(archive.at(name));
}

LinearTensors load_linear(Backend& backend, const SafetensorsArchive& archive, const std::string& name) {
  return {load(backend, archive, name), Tensor(), Tensor()};
}

}  // namespace

struct BlockDrafter::Pass {
  PackedInts ints;
  std::size_t tokens_part = 0, positions_part = 0, write_tables_part = 0, query_tables_part = 0, logit_rows_part = 0;
  std::array<std::size_t, 4> write_parts{}, query_parts{};
  AttentionBatch writes, queries;  // their index tensors attached once the ints are on the device
  int32_t sequences = 0, num_tokens = 0;
  int64_t rows = 0, num_logits = 0;

  void attach() {
    ints.attach(write_parts, writes);
    ints.attach(query_parts, queries);
  }
};

BlockDrafter::BlockDrafter(DrafterCheckpoint checkpoint, BeamModel& target, int32_t max_sequences, bool record_graphs)
    : checkpoint_(std::move(checkpoint)),
      target_(target),
      backend_(target.backend()),
      ring_(static_cast<int32_t>(checkpoint_.config.sliding_window), static_cast<int32_t>(checkpoint_.config.block_size),
            max_sequences) {
  const DrafterConfig& c = checkpoint_.config;
  const ModelConfig& t = target.config();
  // Row i of the block reaches every block key through a window of W_d + B - 1 - i keys only while i < W_d.
  require(c.sliding_window >= c.block_size,
          "{}: key \"sliding_window\": {} is below dflash_config.block_size {}, which this drafter does not run",
          (checkpoint_.archive->source() / "config.json").string(), c.sliding_window, c.block_size);
  require(target.embed_tokens().defined() && target.final_norm().defined(),
          "--speculative-config: the dflash drafter needs the whole target on one process");
  eps_ = static_cast<float>(c.rms_norm_eps.value_or(t.rms_norm_eps));
  residual_scale_ = static_cast<float>(c.residual_scale.value_or(t.residual_scale));
  target_eps_ = static_cast<float>(t.rms_norm_eps);
  const SafetensorsArchive& archive = *checkpoint_.archive;
  fc_ = load_linear(backend_, archive, "fc.weight");
  hidden_norm_ = load(backend_, archive, "hidden_norm.weight");
  for (int64_t j = 0; j < c.num_hidden_layers; ++j) {
    const auto name = [j](std::string_view suffix) { return fmt::format("layers.{}.{}", j, suffix); };
    Layer layer;
    layer.input_norm = load(backend_, archive, name("input_layernorm.weight"));
    layer.post_attention_norm = load(backend_, archive, name("post_attention_layernorm.weight"));
    layer.pre_feedforward_norm = load(backend_, archive, name("pre_feedforward_layernorm.weight"));
    layer.post_feedforward_norm = load(backend_, archive, name("post_feedforward_layernorm.weight"));
    layer.q = load_linear(backend_, archive, name("self_attn.q_proj.weight"));
    layer.k = load_linear(backend_, archive, name("self_attn.k_proj.weight"));
    layer.v = load_linear(backend_, archive, name("self_attn.v_proj.weight"));
    layer.o = load_linear(backend_, archive, name("self_attn.o_proj.weight"));
    layer.mlp = {load_linear(backend_, archive, name("mlp.gate_proj.weight")),
                 load_linear(backend_, archive, name("mlp.up_proj.weight")),
                 load_linear(backend_, archive, name("mlp.down_proj.weight"))};
    layers_.push_back(std::move(layer));
  }
  // One slot more than the ring hands out: the spare slot that padded passes write to (block_logits).
  const std::vector<int64_t> shape{max_sequences + 1, c.num_hidden_layers, ring_.ring_size(), c.num_key_value_heads,
                                   c.head_dim};
  pool_.k = backend_.alloc(DType::F32, shape);
  pool_.v = backend_.alloc(DType::F32, shape);
  backend_.fill_zero(pool_.k);
  backend_.fill_zero(pool_.v);
  target.capture_hidden_after(c.target_layer_ids);
  record_graphs_ = record_graphs && backend_.supports_graphs();
  const char* attention = std::getenv("BEAMLINE_DRAFTER_ATTENTION");
  row_attention_ = attention != nullptr && std::string_view(attention) == "rows";
}

int32_t BlockDrafter::attention_window(int32_t block_row) const {
  const DrafterConfig& c = checkpoint_.config;
  return static_cast<int32_t>(c.sliding_window + c.block_size - 1 - block_row);
}

AttentionParams BlockDrafter::attention_params(int32_t layer, int32_t window) const {
  const DrafterConfig& c = checkpoint_.config;
  AttentionParams params;
  params.num_heads = static_cast<int32_t>(c.num_attention_heads);
  params.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  params.head_dim = static_cast<int32_t>(c.head_dim);
  params.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  params.sliding_window = window;
  params.slot = layer;
  return params;
}

void BlockDrafter::commit(std::span<const VerifiedRows> rows, const Tensor& captured) {
  const DrafterConfig& c = checkpoint_.config;
  if (!captured.defined()) return;  // no target step yet
  const int64_t num_features = captured.dim(0), step_rows = captured.dim(1), hidden = captured.dim(2);
  std::vector<int32_t> gather, positions, ring_positions, query_start{0}, seq_lens, tables;
  for (const VerifiedRows& verified : rows) {
    if (verified.count <= 0) continue;
    require(verified.first_row >= 0 && verified.first_row + verified.count <= step_rows,
            "context features: rows [{}, {}) are outside the step's {} rows", verified.first_row,
            verified.first_row + verified.count, step_rows);
    const int64_t end = verified.first_position + verified.count;
    const ContextFeatureRing::Write write = ring_.begin_write(verified.sequence, verified.first_position, end);
    for (int64_t position = write.first; position < end; ++position) {
      const int64_t row = verified.first_row + (position - verified.first_position);
      for (int64_t l = 0; l < num_features; ++l) gather.push_back(static_cast<int32_t>(l * step_rows + row));
      positions.push_back(static_cast<int32_t>(position));
      ring_positions.push_back(static_cast<int32_t>(position - write.ring.shift));
    }
    query_start.push_back(static_cast<int32_t>(positions.size()));
    seq_lens.push_back(static_cast<int32_t>(end - write.ring.shift));
    tables.insert(tables.end(), {write.ring.slot, write.ring.slot});
  }
  if (positions.empty()) return;
  const auto count = static_cast<int64_t>(positions.size()), sequences = static_cast<int64_t>(seq_lens.size());

  PackedInts ints;
  const std::size_t gather_part = ints.add(gather), positions_part = ints.add(positions),
                    tables_part = ints.add(tables);
  AttentionBatch batch = Backend::describe_attention_batch(ring_positions, query_start, seq_lens);
  const auto batch_parts = ints.add(batch);
  ints.upload(backend_);
  ints.attach(batch_parts, batch);
  const Tensor rope_positions = ints.view(positions_part, {count});
  const Tensor table = ints.view(tables_part, {sequences, 2});

  // c_t = rms(concat_l(h_l,t) fcᵀ, hidden_norm): the concatenation gathered row by row from the capture.
  Tensor concat = backend_.alloc(DType::F32, {count * num_features, hidden});
  backend_.embedding(captured.reshaped({num_features * step_rows, hidden}), ints.view(gather_part, {count * num_features}),
                     concat);
  Tensor fused = backend_.alloc(DType::F32, {count, hidden});
  backend_.linear(concat.reshaped({count, num_features * hidden}), fc_, fused);
  Tensor features = backend_.alloc(DType::F32, {count, hidden});
  backend_.rms_norm(fused, hidden_norm_, eps_, features);

  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  Tensor k = backend_.alloc(DType::F32, {count, kv_width});
  Tensor v = backend_.alloc(DType::F32, {count, kv_width});
  for (std::size_t j = 0; j < layers_.size(); ++j) {
    const std::array<const LinearTensors*, 2> weights{&layers_[j].k, &layers_[j].v};
    const std::array<Tensor*, 2> outputs{&k, &v};
    backend_.linear_many(features, weights, outputs);
    backend_.rope(k, rope_positions, static_cast<int32_t>(c.num_key_value_heads), static_cast<int32_t>(c.head_dim),
                  static_cast<float>(c.rope_theta));
    backend_.write_kv(k, v, pool_, static_cast<int32_t>(j), table, batch);
  }
}

std::vector<DraftProposal> BlockDrafter::propose(std::span<const DraftAnchor> anchors, int32_t num_tokens) {
  std::vector<DraftProposal> drafts(anchors.size());
  const BlockLogits pass = block_logits(anchors, num_tokens);
  if (pass.drafting.empty()) return drafts;
  const auto sequences = static_cast<int64_t>(pass.drafting.size()), rows = pass.logits.dim(0);
  // The argmax and its log-probability under the drafter (its confidence, for adaptive verification).
  std::vector<SampleRow> argmax(static_cast<std::size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    argmax[static_cast<std::size_t>(r)].logit_row = static_cast<int32_t>(r);
    argmax[static_cast<std::size_t>(r)].greedy = true;
    argmax[static_cast<std::size_t>(r)].num_logprobs = 0;
  }
  SampleOutputs sampled;
  sampled.tokens = backend_.alloc(DType::I32, {rows});
  sampled.logprobs = backend_.alloc(DType::F32, {rows});
  sampled.ranks = backend_.alloc(DType::I32, {rows});
  sampled.top_ids = backend_.alloc(DType::I32, {rows, 1});
  sampled.top_logprobs = backend_.alloc(DType::F32, {rows, 1});
  backend_.sample(pass.logits, argmax, sampled);
  // Both read back through pinned buffers, one wait for the two.
  std::vector<int32_t> chosen(static_cast<std::size_t>(rows));
  std::vector<float> logprobs(static_cast<std::size_t>(rows));
  const std::unique_ptr<PendingDownload> tokens_in = backend_.download_later(sampled.tokens, chosen.data());
  const std::unique_ptr<PendingDownload> logprobs_in = backend_.download_later(sampled.logprobs, logprobs.data());
  tokens_in->wait();
  logprobs_in->wait();
  for (int64_t r = 0; r < rows; ++r) {
    DraftProposal& draft = drafts[pass.drafting[static_cast<std::size_t>(r % sequences)]];
    draft.tokens.push_back(chosen[static_cast<std::size_t>(r)]);
    draft.confidence.push_back(std::exp(logprobs[static_cast<std::size_t>(r)]));
  }
  return drafts;
}

BlockDrafter::BlockLogits BlockDrafter::block_logits(std::span<const DraftAnchor> anchors, int32_t num_tokens) {
  const DrafterConfig& c = checkpoint_.config;
  const auto block = static_cast<int32_t>(c.block_size);
  require(num_tokens >= 1 && num_tokens < block, "block drafter: {} draft tokens asked of blocks of {}", num_tokens,
          block);
  BlockLogits result;
  std::vector<std::size_t>& drafting = result.drafting;  // anchors whose context is there
  std::vector<RingWindow> windows;
  for (std::size_t a = 0; a < anchors.size(); ++a) {
    if (const std::optional<RingWindow> window = ring_.begin_draft(anchors[a].sequence, anchors[a].position)) {
      drafting.push_back(a);
      windows.push_back(*window);
    }
  }
  if (drafting.empty()) return result;
  const auto drafting_count = static_cast<int32_t>(drafting.size());
  // Recorded passes run for a power-of-two number of blocks, the rest drafting nothing at position 0 of the spare ring
  // slot (their writes land there, their logits after the real ones), so that a batch whose drafting sequences vary
  // records a handful of graphs instead of one per count.
  const int32_t sequences =
      record_graphs_ ? static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(drafting_count))) : drafting_count;
  const DraftAnchor padding{-1, 0, static_cast<int32_t>(c.mask_token_id)};
  const RingWindow spare{ring_.max_sequences(), 0};
  auto anchor_of = [&](int32_t s) -> const DraftAnchor& {
    return s < drafting_count ? anchors[drafting[static_cast<std::size_t>(s)]] : padding;
  };
  auto window_of = [&](int32_t s) -> const RingWindow& {
    return s < drafting_count ? windows[static_cast<std::size_t>(s)] : spare;
  };
  const int64_t rows = int64_t{block} * sequences;

  // Block-row-major: row i * S + s is block row i of drafting sequence s. The logits: the real sequences' rows first
  // (row (i - 1) * drafting_count + s), then the padding's.
  std::vector<int32_t> tokens, positions, write_positions, write_starts{0}, write_lens, write_tables;
  std::vector<int32_t> query_positions, query_starts{0}, query_lens, query_tables, logit_rows, padding_rows;
  for (int32_t i = 0; i < block; ++i) {
    for (int32_t s = 0; s < sequences; ++s) {
      const DraftAnchor& anchor = anchor_of(s);
      const RingWindow& window = window_of(s);
      const int64_t position = anchor.position + i;
      tokens.push_back(i == 0 ? anchor.token : static_cast<int32_t>(c.mask_token_id));
      positions.push_back(static_cast<int32_t>(position));
      write_positions.push_back(static_cast<int32_t>(position - window.shift));
      write_starts.push_back(static_cast<int32_t>(write_positions.size()));
      write_lens.push_back(static_cast<int32_t>(anchor.position + block - window.shift));
      write_tables.insert(write_tables.end(), {window.slot, window.slot});
      if (i >= 1 && i <= num_tokens) (s < drafting_count ? logit_rows : padding_rows).push_back(i * sequences + s);
    }
  }
  logit_rows.insert(logit_rows.end(), padding_rows.begin(), padding_rows.end());
  // Every query of the block attends as the block's last position; the window (per block row) does the rest.
  for (int32_t s = 0; s < sequences; ++s) {
    const DraftAnchor& anchor = anchor_of(s);
    const RingWindow& window = window_of(s);
    query_positions.push_back(static_cast<int32_t>(anchor.position + block - 1 - window.shift));
    query_starts.push_back(s + 1);
    query_lens.push_back(static_cast<int32_t>(anchor.position + block - window.shift));
    query_tables.insert(query_tables.end(), {window.slot, window.slot});
  }
  Pass pass;
  pass.sequences = sequences;
  pass.num_tokens = num_tokens;
  pass.rows = rows;
  pass.num_logits = static_cast<int64_t>(logit_rows.size());
  pass.tokens_part = pass.ints.add(tokens);
  pass.positions_part = pass.ints.add(positions);
  pass.write_tables_part = pass.ints.add(write_tables);
  pass.query_tables_part = pass.ints.add(query_tables);
  pass.logit_rows_part = pass.ints.add(logit_rows);
  pass.writes = Backend::describe_attention_batch(write_positions, write_starts, write_lens);
  pass.queries = Backend::describe_attention_batch(query_positions, query_starts, query_lens);
  pass.write_parts = pass.ints.add(pass.writes);
  pass.query_parts = pass.ints.add(pass.queries);
  const int64_t real_logits = int64_t{num_tokens} * drafting_count;
  if (record_graphs_) {
    if (const std::optional<std::string> key = graph_key(pass)) {
      const Tensor logits = replay_or_record(pass, *key);
      result.logits = logits.view(0, {real_logits, logits.dim(1)});
      return result;
    }
  }
  pass.ints.upload(backend_);
  pass.attach();
  const Tensor logits = run(pass);
  result.logits = logits.view(0, {real_logits, logits.dim(1)});
  return result;
}

std::optional<std::string> BlockDrafter::graph_key(const Pass& pass) const {
  // The shapes follow from the drafting sequences and the draft tokens; block_attention plans nothing on the host, the
  // one-row calls' plans follow from the queries' lengths.
  std::string key = fmt::format("{}x{}", pass.sequences, pass.num_tokens);
  if (!row_attention_) return key;
  for (int32_t i = 0; i < static_cast<int32_t>(checkpoint_.config.block_size); ++i) {
    const std::optional<std::string> plan = backend_.attention_signature(pass.queries, pool_, attention_params(0, attention_window(i)));
    if (!plan) return std::nullopt;
    key += fmt::format("|{}", *plan);
  }
  return key;
}

Tensor BlockDrafter::replay_or_record(Pass& pass, const std::string& key) {
  if (const auto found = graphs_.find(key); found != graphs_.end()) {
    Graph& graph = found->second;
    pass.ints.copy_to(backend_, graph.inputs);
    graph.last_used = ++passes_;
    backend_.replay(*graph.graph);
    ++replayed_;
    return graph.logits;
  }
  if (graphs_.size() >= kMaxGraphs) {
    graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    }));
  }
  Graph graph;
  pass.ints.upload(backend_);
  pass.attach();
  graph.inputs = pass.ints.device();
  // This pass runs op by op first (what ops make lazily on the device, such as attention work lists, then exists
  // before the recording, which must not upload); recording runs nothing, so the ring is written once.
  const Tensor logits = run(pass);
  graph.graph = record_graph(backend_, [&] { graph.logits = run(pass); });
  graph.last_used = ++passes_;
  graphs_.emplace(key, std::move(graph));
  ++recorded_;
  return logits;
}

Tensor BlockDrafter::run(const Pass& pass) {
  const DrafterConfig& c = checkpoint_.config;
  const ModelConfig& target = target_.config();
  const auto block = static_cast<int32_t>(c.block_size);
  const int32_t sequences = pass.sequences;
  const int64_t rows = pass.rows;
  const PackedInts& ints = pass.ints;
  const Tensor rope_positions = ints.view(pass.positions_part, {rows});
  const Tensor write_table = ints.view(pass.write_tables_part, {rows, 2});
  const Tensor query_table = ints.view(pass.query_tables_part, {sequences, 2});

  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads,
                head_dim = c.head_dim, q_width = heads * head_dim;
  const auto theta = static_cast<float>(c.rope_theta);
  Tensor y = backend_.alloc(DType::F32, {rows, hidden});
  Tensor h = backend_.alloc(DType::F32, {rows, hidden});
  Tensor branch = backend_.alloc(DType::F32, {rows, hidden});
  Tensor q = backend_.alloc(DType::F32, {rows, q_width});
  Tensor attention = backend_.alloc(DType::F32, {rows, q_width});
  Tensor k = backend_.alloc(DType::F32, {rows, kv_heads * head_dim});
  Tensor v = backend_.alloc(DType::F32, {rows, kv_heads * head_dim});
  backend_.embedding(target_.embed_tokens(), ints.view(pass.tokens_part, {rows}), y);
  backend_.rms_norm(y, layers_.front().input_norm, eps_, h);
  for (std::size_t j = 0; j < layers_.size(); ++j) {
    const Layer& layer = layers_[j];
    const auto slot = static_cast<int32_t>(j);
    const std::array<const LinearTensors*, 3> weights{&layer.q, &layer.k, &layer.v};
    const std::array<Tensor*, 3> outputs{&q, &k, &v};
    backend_.linear_many(h, weights, outputs);
    backend_.rope_qk(q, k, rope_positions, static_cast<int32_t>(heads), static_cast<int32_t>(kv_heads),
                     static_cast<int32_t>(head_dim), theta);
    backend_.write_kv(k, v, pool_, slot, write_table, pass.writes);
    if (row_attention_) {
      for (int32_t i = 0; i < block; ++i) {
        const Tensor rows_q = q.view(int64_t{i} * sequences * q_width, {sequences, q_width});
        Tensor rows_out = attention.view(int64_t{i} * sequences * q_width, {sequences, q_width});
        backend_.paged_attention(rows_q, pool_, query_table, pass.queries, attention_params(slot, attention_window(i)),
                                 rows_out);
      }
    } else {
      backend_.block_attention(q, pool_, query_table, pass.queries,
                               attention_params(slot, static_cast<int32_t>(c.sliding_window)), attention);
    }
    backend_.linear(attention, layer.o, branch);
    // Each residual add with the next sub-layer's input norm, one op where a next sub-layer exists.
    backend_.add_rms_norm_then_norm(y, branch, layer.post_attention_norm, eps_, residual_scale_,
                                    layer.pre_feedforward_norm, h);
    backend_.swiglu(h, layer.mlp, branch);
    if (j + 1 < layers_.size()) {
      backend_.add_rms_norm_then_norm(y, branch, layer.post_feedforward_norm, eps_, residual_scale_,
                                      layers_[j + 1].input_norm, h);
    } else {
      backend_.add_rms_norm(y, branch, layer.post_feedforward_norm, eps_, residual_scale_);
    }
  }

  // Block rows 1..K through the target's final norm, LM head and softcap; the draft is their argmax.
  Tensor logits = backend_.alloc(DType::F32, {pass.num_logits, target.vocab_size});
  backend_.lm_head(y, ints.view(pass.logit_rows_part, {pass.num_logits}), target_.final_norm(), target_eps_,
                   target_.lm_head(), static_cast<float>(target.final_logit_softcapping), logits);
  return logits;
}

}  // namespace beamline

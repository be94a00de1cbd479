#include "runner/kv_cache.h"

#include <algorithm>

#include "util/error.h"

namespace beamline {
namespace {
bool has_sliding_layer(const ModelConfig& config) {
  return std::find(config.layer_types.begin(), config.layer_types.end(), LayerType::Sliding) !=
         config.layer_types.end();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int32_t default_block_size(const ModelConfig& config) {
  if (!has_sliding_layer(config)) return 16;
  for (int32_t size : {16, 8, 4, 2})
    if (config.sliding_window % size == 0) return size;
  return 1;
}

KvCacheLayout make_kv_cache_layout(const ModelConfig& config, int32_t block_size, int32_t num_blocks) {
  require(block_size > 0, "KV layout: block size {} must be positive", block_size);
  require(num_blocks >= 0, "KV layout: block count {} must not be negative", num_blocks);
  require(static_cast<int64_t>(config.layer_types.size()) == config.num_hidden_layers,
          "KV layout: layer_types has {} entries for {} layers", config.layer_types.size(), config.num_hidden_layers);
  if (has_sliding_layer(config))
    require(config.sliding_window > 0 && config.sliding_window % block_size == 0,
            "KV layout: block size {} does not divide sliding_window {}", block_size, config.sliding_window);
  std::vector<int32_t> full, sliding;
  for (int32_t layer = 0; layer < static_cast<int32_t>(config.num_hidden_layers); ++layer)
    (config.layer_types[layer] == LayerType::Full ? full : sliding).push_back(layer);

  KvCacheLayout layout;
  layout.block_size = block_size;
  layout.num_blocks = num_blocks;
  layout.slots_per_block = std::max<int32_t>(1, static_cast<int32_t>(full.size()));
  layout.layer_group.assign(static_cast<std::size_t>(config.num_hidden_layers), 0);
  layout.layer_slot.assign(layout.layer_group.size(), 0);
  for (const auto* layers : {&full, &sliding}) {
    for (std::size_t i = 0; i < layers->size(); ++i) {
      if (i % static_cast<std::size_t>(layout.slots_per_block) == 0) layout.group_is_sliding.push_back(layers == &sliding);
      layout.layer_group[(*layers)[i]] = layout.num_groups() - 1;
      layout.layer_slot[(*layers)[i]] = static_cast<int32_t>(i % static_cast<std::size_t>(layout.slots_per_block));
    }
  }
  return layout;
}

int32_t single_sequence_blocks(const KvCacheLayout& layout, const ModelConfig& config, int64_t max_len,
                               int64_t max_step) {
  const int64_t all = ceil_div(max_len, layout.block_size);
  const int64_t window = std::min(all, ceil_div(max_step + config.sliding_window - 1, layout.block_size) + 1);
  int64_t total = 0;
  for (bool sliding : layout.group_is_sliding) total += sliding ? window : all;
  require(total <= INT32_MAX, "KV cache: {} blocks for a sequence of {} positions is too many", total, max_len);
  return static_cast<int32_t>(total);
}

KvMemoryPrediction predict_kv_memory(const ModelConfig& config, const KvCacheLayout& layout, DType kv_dtype,
                                     int64_t tokens) {
  require(tokens >= 1, "KV prediction: {} tokens must be at least 1", tokens);
  KvMemoryPrediction p;
  p.full_layers = std::count(config.layer_types.begin(), config.layer_types.end(), LayerType::Full);
  p.sliding_layers = static_cast<int64_t>(config.layer_types.size()) - p.full_layers;
  const int64_t position_bytes = 2 * config.num_key_value_heads * config.head_dim * static_cast<int64_t>(dtype_size(kv_dtype));
  p.bytes_per_token = p.full_layers * position_bytes;
  p.sliding_bytes = p.sliding_layers * std::min<int64_t>(tokens, config.sliding_window) * position_bytes;
  p.bytes = p.bytes_per_token * tokens + p.sliding_bytes;
  p.block_bytes = int64_t{layout.slots_per_block} * layout.block_size * position_bytes;
  // Decoding position `tokens` needs the table to cover [0, tokens + 1); a sliding group gives back every block
  // wholly before the window of that position (kv_cache_manager.cpp, first_needed_block).
  const int64_t end_blocks = ceil_div(tokens + 1, layout.block_size);
  const int64_t first_sliding = first_visible_position(tokens, config.sliding_window) / layout.block_size;
  for (bool sliding : layout.group_is_sliding) {
    if (sliding) p.sliding_blocks += end_blocks - first_sliding;
    else p.full_blocks += end_blocks;
  }
  return p;
}

KvCache::KvCache(Backend& backend, const ModelConfig& config, KvCacheLayout layout, DType dtype)
    : layout_(std::move(layout)) {
  require(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F8_E4M3,
          "KV cache: dtype {} is not supported (F32, BF16 or F8_E4M3)", dtype_name(dtype));
  require(layout_.num_blocks > 0, "KV cache: the layout has no blocks");
  const std::vector<int64_t> shape{layout_.num_blocks, layout_.slots_per_block, layout_.block_size,
                                   config.num_key_value_heads, config.head_dim};
  // K and V in one allocation and one memset.
  std::vector<int64_t> both_shape{2};
  both_shape.insert(both_shape.end(), shape.begin(), shape.end());
  Tensor both = backend.alloc(dtype, both_shape);
  backend.fill_zero(both);
  pool_.k = both.slice_first(0);
  pool_.v = both.slice_first(1);
}

SingleSequenceBlocks::SingleSequenceBlocks(const KvCacheLayout& layout, int64_t sliding_window)
    : layout_(layout), sliding_window_(sliding_window), tables_(static_cast<std::size_t>(layout.num_groups())) {
  for (int32_t block = layout.num_blocks - 1; block >= 0; --block) free_.push_back(block);
}

const std::vector<std::vector<int32_t>>& SingleSequenceBlocks::prepare(int64_t query_begin, int64_t end) {
  require(0 <= query_begin && query_begin < end, "KV blocks: empty or negative step [{}, {})", query_begin, end);
  const int64_t size = layout_.block_size;
  for (int32_t group = 0; group < layout_.num_groups(); ++group) {
    auto& table = tables_[group];
    if (layout_.group_is_sliding[group]) {
      // Keys at t <= query_begin - window are invisible to every query of this step and all later ones.
      const int64_t first_visible = first_visible_position(query_begin, sliding_window_);
      for (std::size_t i = 0; i < table.size() && static_cast<int64_t>(i + 1) * size <= first_visible; ++i)
        if (table[i] != kNullBlock) free_.push_back(std::exchange(table[i], kNullBlock));
    }
  }
  for (int32_t group = 0; group < layout_.num_groups(); ++group) {
    auto& table = tables_[group];
    while (static_cast<int64_t>(table.size()) * size < end) {
      require(!free_.empty(), "KV blocks: the pool of {} blocks is full at position {}", layout_.num_blocks, end);
      table.push_back(free_.back());
      free_.pop_back();
    }
  }
  return tables_;
}

}  // namespace beamline

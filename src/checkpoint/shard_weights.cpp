#include "checkpoint/shard_weights.h"

#include <cstring>

#include "util/counter_random.h"
#include "util/error.h"

namespace beamline {
namespace {

class Slicer {
 public:
  explicit Slicer(BeamWeights& weights) : weights_(weights) {}

  // Rows [begin, begin + count) of a [rows, columns] projection.
  void rows(LinearWeight& weight, int64_t begin, int64_t count) { slice(weight, 0, begin, count); }
  // Columns [begin, begin + count).
  void columns(LinearWeight& weight, int64_t begin, int64_t count) { slice(weight, 1, begin, count); }

 private:
  void slice(LinearWeight& weight, int axis, int64_t begin, int64_t count) {
    TensorView& view = weight.weight;
    require(view.shape.size() == 2 && begin >= 0 && begin + count <= view.shape[axis],
            "shard: cannot take {} of [{}, {}) from {} {}", axis == 0 ? "rows" : "columns", begin, begin + count,
            view.name, shape_string(view.shape));
    if (count == view.shape[axis]) return;
    require(!weight.quantized(), "shard: {} is quantized; slicing quantized weights across ranks is not supported yet",
            view.name);
    const int64_t rows = view.shape[0], columns = view.shape[1];
    const std::size_t element = dtype_size(view.dtype);
    std::vector<int64_t> shape = axis == 0 ? std::vector<int64_t>{count, columns} : std::vector<int64_t>{rows, count};
    if (view.data != nullptr && axis == 0) {  // contiguous rows: a view into the mapping
      view.data += static_cast<std::size_t>(begin * columns) * element;
    } else {
      auto buffer = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(shape[0] * shape[1]) * element);
      const int64_t row_begin = axis == 0 ? begin : 0, column_begin = axis == 1 ? begin : 0;
      for (int64_t r = 0; r < shape[0]; ++r) {
        std::byte* out = buffer->data() + static_cast<std::size_t>(r * shape[1]) * element;
        const int64_t source = (row_begin + r) * columns + column_begin;
        if (view.data != nullptr) {
          std::memcpy(out, view.data + static_cast<std::size_t>(source) * element, static_cast<std::size_t>(shape[1]) * element);
        } else {
          draw(view, source, shape[1], out);
        }
      }
      view.data = buffer->data();
      weights_.slice_buffers.push_back(std::move(buffer));
    }
    view.shape = std::move(shape);
    view.nbytes = static_cast<std::size_t>(view.shape[0] * view.shape[1]) * element;
  }

  // Elements [first, first + count) of a dummy tensor, as Backend::random_weight would draw them.
  void draw(const TensorView& view, int64_t first, int64_t count, std::byte* out) const {
    require(weights_.random_seed.has_value(), "shard: {} has no data and the model is not a dummy one", view.name);
    const RandomInit& init = weights_.random_inits.at(view.name);
    const uint64_t key = stream_key(*weights_.random_seed, view.name);
    const std::size_t element = dtype_size(view.dtype);
    for (int64_t i = 0; i < count; ++i)
      store_float(view.dtype, normal_value(key, static_cast<uint64_t>(first + i), init.mean, init.stddev),
                  out + static_cast<std::size_t>(i) * element);
  }

  BeamWeights& weights_;
};

}  // namespace

BeamWeights shard_weights(const BeamWeights& weights, const ModelShard& shard) {
  const ModelConfig& config = weights.config;
  BeamWeights out = weights;
  if (shard.whole_model(config)) return out;
  Slicer slicer(out);
  const int64_t D = config.head_dim;
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    LayerWeights& layer = out.layers.at(static_cast<std::size_t>(i));
    slicer.rows(layer.q_proj, shard.q_head_begin * D, shard.q_heads * D);
    slicer.rows(layer.k_proj, shard.kv_head_begin * D, shard.kv_heads * D);
    slicer.rows(layer.v_proj, shard.kv_head_begin * D, shard.kv_heads * D);
    slicer.columns(layer.o_proj, shard.q_head_begin * D, shard.q_heads * D);
    if (layer.mlp) {
      slicer.rows(layer.mlp->gate_proj, shard.ffn_begin, shard.ffn_size);
      slicer.rows(layer.mlp->up_proj, shard.ffn_begin, shard.ffn_size);
      slicer.columns(layer.mlp->down_proj, shard.ffn_begin, shard.ffn_size);
    }
    for (int64_t e = shard.expert_begin; e < shard.expert_end && e < static_cast<int64_t>(layer.experts.size()); ++e) {
      ExpertWeights& expert = layer.experts[static_cast<std::size_t>(e)];
      slicer.rows(expert.gate_proj, shard.moe_begin, shard.moe_size);
      slicer.rows(expert.up_proj, shard.moe_begin, shard.moe_size);
      slicer.columns(expert.down_proj, shard.moe_begin, shard.moe_size);
    }
  }
  if (shard.layer_end == config.num_hidden_layers) slicer.rows(out.lm_head, shard.vocab_begin, shard.vocab_size);
  return out;
}

}  // namespace beamline

#include "checkpoint/shard_weights.h"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <string_view>

#include "checkpoint/quantize_tensors.h"
#include "quant/slice.h"
#include "util/counter_random.h"
#include "util/error.h"

namespace beamline {
namespace {

class Slicer {
 public:
  explicit Slicer(BeamWeights& weights) : weights_(weights) {}

  // Rows [begin, begin + count) of a [rows, columns] projection; `flag` is what cuts it (for a refusal's message).
  void rows(LinearWeight& weight, int64_t begin, int64_t count, std::string_view flag) {
    slice(weight, SliceAxis::Rows, begin, count, flag);
  }
  // Columns [begin, begin + count).
  void columns(LinearWeight& weight, int64_t begin, int64_t count, std::string_view flag) {
    slice(weight, SliceAxis::Columns, begin, count, flag);
  }

 private:
  void slice(LinearWeight& weight, SliceAxis axis, int64_t begin, int64_t count, std::string_view flag) {
    const int dimension = axis == SliceAxis::Rows ? 0 : 1;
    const TensorView& view = weight.weight;
    require(view.shape.size() == 2, "shard: {} {} is not a matrix", view.name, shape_string(view.shape));
    const int64_t extent = weight.quantized() ? logical_shape(weight)[dimension] : view.shape[dimension];
    require(begin >= 0 && begin + count <= extent, "shard: cannot take {} of [{}, {}) from {} {}",
            axis == SliceAxis::Rows ? "rows" : "columns", begin, begin + count, view.name, shape_string(view.shape));
    if (count == extent) return;
    if (weight.quantized()) slice_quantized(weight, axis, begin, count, flag);
    else slice_float(weight, dimension, begin, count);
  }

  QuantScheme scheme() const {
    require(weights_.config.quantization.has_value(), "shard: quantized projections but no quantization_config");
    return quant_scheme_of(*weights_.config.quantization);
  }

  // [out, in] of the logical matrix (nvfp4 stores two codes a byte).
  std::vector<int64_t> logical_shape(const LinearWeight& weight) const {
    const std::vector<int64_t>& shape = weight.weight.shape;
    return {shape.at(0), scheme() == QuantScheme::Nvfp4 ? 2 * shape.at(1) : shape.at(1)};
  }

  // Every rank's part is checked, not only this one's, so that all ranks refuse a layout alike.
  void require_parts(const LinearWeight& weight, SliceAxis axis, int64_t count, std::string_view flag) const {
    const std::vector<int64_t> shape = logical_shape(weight);
    const int64_t extent = shape[axis == SliceAxis::Rows ? 0 : 1];
    for (int64_t begin = 0; begin < extent; begin += count) {
      const std::string problem = quantized_slice_problem(scheme(), shape[0], shape[1], axis, begin, count);
      require(problem.empty(),
              "shard: {} {} is quantized ({}) and {} would cut it into {} parts of {} {}: {}; such a part cannot "
              "be stored with its own scales (docs/parallel.md, Quantized weights)",
              weight.weight.name, shape_string(shape), quant_scheme_name(scheme()), flag, extent / count, count,
              axis == SliceAxis::Rows ? "rows" : "columns", problem);
    }
  }

  void slice_quantized(LinearWeight& weight, SliceAxis axis, int64_t begin, int64_t count, std::string_view flag) {
    require_parts(weight, axis, count, flag);
    const std::vector<int64_t> shape = logical_shape(weight);
    float scale_2 = 1.0f;
    if (weight.scale_2.data != nullptr) std::memcpy(&scale_2, weight.scale_2.data, sizeof scale_2);
    const QuantizedWeightView whole{scheme(), shape[0], shape[1], reinterpret_cast<const uint8_t*>(weight.weight.data),
                                    reinterpret_cast<const uint8_t*>(weight.scale.data), scale_2};
    if (axis == SliceAxis::Rows) {  // a view into the mapping (or the bytes quantized at load)
      const QuantizedWeightView part = quantized_rows(whole, begin, count);
      point(weight, part.out_features, part.in_features, reinterpret_cast<const std::byte*>(part.codes),
            reinterpret_cast<const std::byte*>(part.scales));
      return;
    }
    const QuantizedWeight part = quantized_columns(whole, begin, count);
    point(weight, part.out_features, part.in_features, keep(part.codes), keep(part.scales));
  }

  // `weight`'s codes and scales become the part's, shaped as the scheme lays out an [out, in] weight.
  void point(LinearWeight& weight, int64_t out, int64_t in, const std::byte* codes, const std::byte* scales) const {
    const QuantLayout layout = quant_layout(scheme(), out, in);
    weight.weight.data = codes;
    weight.weight.shape = layout.weight_shape;
    weight.weight.nbytes = static_cast<std::size_t>(layout.weight_shape[0] * layout.weight_shape[1]) *
                           dtype_size(weight.weight.dtype);
    weight.scale.data = scales;
    weight.scale.shape = layout.scale_shape;
    weight.scale.nbytes = static_cast<std::size_t>(layout.scale_shape[0] * layout.scale_shape[1]) *
                          dtype_size(weight.scale.dtype);
  }

  // A copy of `bytes` that lives as long as the weights.
  const std::byte* keep(const std::vector<uint8_t>& bytes) {
    auto buffer = std::make_shared<std::vector<std::byte>>(bytes.size());
    std::memcpy(buffer->data(), bytes.data(), bytes.size());
    weights_.slice_buffers.push_back(buffer);
    return buffer->data();
  }

  void slice_float(LinearWeight& weight, int axis, int64_t begin, int64_t count) {
    TensorView& view = weight.weight;
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
  const std::string tp = fmt::format("--tensor-parallel-size {}", config.num_attention_heads / shard.q_heads);
  const std::string moe_tp = tp + " without --enable-expert-parallel (which keeps experts whole)";
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    LayerWeights& layer = out.layers.at(static_cast<std::size_t>(i));
    slicer.rows(layer.q_proj, shard.q_head_begin * D, shard.q_heads * D, tp);
    slicer.rows(layer.k_proj, shard.kv_head_begin * D, shard.kv_heads * D, tp);
    slicer.rows(layer.v_proj, shard.kv_head_begin * D, shard.kv_heads * D, tp);
    slicer.columns(layer.o_proj, shard.q_head_begin * D, shard.q_heads * D, tp);
    if (layer.mlp) {
      slicer.rows(layer.mlp->gate_proj, shard.ffn_begin, shard.ffn_size, tp);
      slicer.rows(layer.mlp->up_proj, shard.ffn_begin, shard.ffn_size, tp);
      slicer.columns(layer.mlp->down_proj, shard.ffn_begin, shard.ffn_size, tp);
    }
    for (int64_t e = shard.expert_begin; e < shard.expert_end && e < static_cast<int64_t>(layer.experts.size()); ++e) {
      ExpertWeights& expert = layer.experts[static_cast<std::size_t>(e)];
      slicer.rows(expert.gate_proj, shard.moe_begin, shard.moe_size, moe_tp);
      slicer.rows(expert.up_proj, shard.moe_begin, shard.moe_size, moe_tp);
      slicer.columns(expert.down_proj, shard.moe_begin, shard.moe_size, moe_tp);
    }
  }
  if (shard.layer_end == config.num_hidden_layers)
    slicer.rows(out.lm_head, shard.vocab_begin, shard.vocab_size, tp + " (the vocabulary-parallel LM head)");
  return out;
}

}  // namespace beamline

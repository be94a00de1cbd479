#include "checkpoint/quantize_tensors.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "model/checkpoint_layout.h"
#include "quant/quantize.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace beamline {
namespace {

constexpr std::size_t kBandFloats = std::size_t{4} << 20;  // 16 MiB of F32 per quantized band
constexpr std::size_t kFillTaskBytes = std::size_t{1} << 20;

void to_floats(DType dtype, const std::byte* bytes, std::size_t count, float* out) {
  for (std::size_t i = 0; i < count; ++i) {
    uint16_t half;
    switch (dtype) {
      case DType::F32:
        std::memcpy(out + i, bytes + 4 * i, 4);
        break;
      case DType::BF16:
        std::memcpy(&half, bytes + 2 * i, 2);
        out[i] = bf16_to_f32(half);
        break;
      case DType::F16:
        std::memcpy(&half, bytes + 2 * i, 2);
        out[i] = f16_to_f32(half);
        break;
      default:
        fail("quantize: cannot read {} values as floats", dtype_name(dtype));
    }
  }
}

// One float projection [out, in] and how to quantize any band of its rows. Shared by the tensors it becomes; their
// fills run on several threads at once.
class ProjectionQuantizer {
 public:
  ProjectionQuantizer(TensorSource source, QuantScheme scheme)
      : source_(std::move(source)), scheme_(scheme), out_(source_.shape.at(0)), in_(source_.shape.at(1)) {
    require(source_.dtype == DType::F32 || source_.dtype == DType::BF16 || source_.dtype == DType::F16,
            "quantize: tensor \"{}\" is {}, not a float weight (F32, BF16, F16)", source_.name,
            dtype_name(source_.dtype));
    const int64_t granularity = quant_row_granularity(scheme_);
    band_rows_ = std::max<int64_t>(1, static_cast<int64_t>(kBandFloats) / in_ / granularity) * granularity;
  }

  const std::string& name() const { return source_.name; }
  int64_t out() const { return out_; }
  int64_t in() const { return in_; }
  QuantScheme scheme() const { return scheme_; }
  int64_t band_rows() const { return band_rows_; }

  // Rows [first, first + count) as quantize_weight_rows gives them (first a multiple of the row granularity).
  QuantizedWeight quantize(int64_t first, int64_t count) {
    const std::vector<float> values = read_rows(first, count);
    return quantize_weight_rows(scheme_, values, count, in_, scheme_ == QuantScheme::Nvfp4 ? amax() : 0.0f);
  }

  // The whole tensor's largest magnitude (nvfp4's weight_scale_2), read once, a band at a time.
  float amax() {
    std::call_once(amax_once_, [&] {
      float amax = 0.0f;
      for (int64_t first = 0; first < out_; first += band_rows_) {
        const int64_t count = std::min(band_rows_, out_ - first);
        try {
          amax = std::max(amax, weight_amax(read_rows(first, count)));
        } catch (const Error& error) {
          fail("quantize: tensor \"{}\" rows [{}, {}): {}", source_.name, first, first + count, error.what());
        }
      }
      amax_ = amax;
    });
    return amax_;
  }

 private:
  std::vector<float> read_rows(int64_t first, int64_t count) const {
    const std::size_t element = dtype_size(source_.dtype), n = static_cast<std::size_t>(count * in_);
    std::vector<std::byte> bytes(n * element);
    source_.fill(static_cast<std::size_t>(first * in_) * element, bytes);
    std::vector<float> values(n);
    to_floats(source_.dtype, bytes.data(), n, values.data());
    return values;
  }

  TensorSource source_;
  QuantScheme scheme_;
  int64_t out_, in_, band_rows_ = 1;
  std::once_flag amax_once_;
  float amax_ = 0.0f;
};

enum class Part { Codes, Scales };

// The stored tensor `part` of a quantized projection. Its stored row k covers weight rows [k*m, (k+1)*m) with m the
// scheme's row granularity for fp8's scales and 1 otherwise; a fill quantizes the bands of weight rows that the
// asked byte range needs and copies out its bytes.
TensorSource part_source(const std::shared_ptr<ProjectionQuantizer>& quantizer, Part part, std::string name,
                         DType dtype, std::vector<int64_t> shape) {
  const int64_t row_bytes = shape.at(1) * static_cast<int64_t>(dtype_size(dtype));
  const int64_t rows_per_stored_row =
      part == Part::Scales && quantizer->scheme() == QuantScheme::Fp8Block ? kFp8BlockSize : 1;
  auto fill = [quantizer, part, row_bytes, rows_per_stored_row](std::size_t offset, std::span<std::byte> out) {
    const auto begin = static_cast<int64_t>(offset), end = begin + static_cast<int64_t>(out.size());
    const int64_t granularity = quant_row_granularity(quantizer->scheme());
    int64_t first = begin / row_bytes * rows_per_stored_row / granularity * granularity;
    // Whole granules only: an fp8 block cut short here would get another amax than in the whole tensor.
    const int64_t stored_end = (end + row_bytes - 1) / row_bytes * rows_per_stored_row;
    const int64_t last = std::min(quantizer->out(), (stored_end + granularity - 1) / granularity * granularity);
    for (; first < last; first += quantizer->band_rows()) {
      const QuantizedWeight band = quantizer->quantize(first, std::min(quantizer->band_rows(), last - first));
      const std::vector<uint8_t>& bytes = part == Part::Codes ? band.codes : band.scales;
      const int64_t band_begin = first / rows_per_stored_row * row_bytes;
      const int64_t from = std::max(begin, band_begin);
      const int64_t to = std::min(end, band_begin + static_cast<int64_t>(bytes.size()));
      if (from < to) std::memcpy(out.data() + (from - begin), bytes.data() + (from - band_begin), static_cast<std::size_t>(to - from));
    }
  };
  return TensorSource{std::move(name), dtype, std::move(shape), std::move(fill)};
}

std::vector<TensorSource> quantized_tensors(TensorSource source, QuantScheme scheme) {
  const std::string prefix = source.name.substr(0, source.name.size() - std::string_view(".weight").size());
  auto quantizer = std::make_shared<ProjectionQuantizer>(std::move(source), scheme);
  const QuantLayout layout = quant_layout(scheme, quantizer->out(), quantizer->in());
  std::vector<TensorSource> tensors;
  tensors.push_back(part_source(quantizer, Part::Codes, quantizer->name(), layout.weight_dtype, layout.weight_shape));
  tensors.push_back(part_source(quantizer, Part::Scales, prefix + "." + std::string(layout.scale_suffix),
                                layout.scale_dtype, layout.scale_shape));
  if (layout.has_scale_2)
    tensors.push_back(TensorSource{prefix + ".weight_scale_2", DType::F32, {}, [quantizer](std::size_t, std::span<std::byte> out) {
                                     const float scale_2 = nvfp4_scale_2(quantizer->amax());
                                     std::memcpy(out.data(), &scale_2, sizeof scale_2);
                                   }});
  return tensors;
}

bool ignored(const QuantizationConfig& quant, std::string_view weight_name) {
  const std::string_view prefix = weight_name.substr(0, weight_name.size() - std::string_view(".weight").size());
  return std::any_of(quant.ignored_layers.begin(), quant.ignored_layers.end(),
                     [&](const std::string& entry) { return prefix.starts_with(entry); });
}

// Every projection of `weights` that `shard` computes (its stage's layers, its experts, the LM head on the last
// stage), by its tensor name.
std::map<std::string, LinearWeight*, std::less<>> projections(BeamWeights& weights, const ModelShard& shard) {
  std::map<std::string, LinearWeight*, std::less<>> found;
  const auto add = [&](LinearWeight& weight) { found.emplace(weight.weight.name, &weight); };
  if (!weights.config.tie_word_embeddings && shard.layer_end == weights.config.num_hidden_layers) add(weights.lm_head);
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    LayerWeights& layer = weights.layers.at(static_cast<std::size_t>(i));
    for (LinearWeight* weight : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj}) add(*weight);
    std::vector<ExpertWeights*> mlps;
    if (layer.mlp) mlps.push_back(&*layer.mlp);
    for (int64_t e = shard.expert_begin; e < shard.expert_end && e < static_cast<int64_t>(layer.experts.size()); ++e)
      mlps.push_back(&layer.experts[static_cast<std::size_t>(e)]);
    for (ExpertWeights* mlp : mlps)
      for (LinearWeight* weight : {&mlp->gate_proj, &mlp->up_proj, &mlp->down_proj}) add(*weight);
  }
  return found;
}

// The float projections of `weights` as sources: their mapped bytes, or for dummy weights the host draw that
// make-model writes for the same seed.
std::vector<TensorSource> float_projection_sources(const BeamWeights& weights,
                                                   const std::map<std::string, LinearWeight*, std::less<>>& wanted) {
  std::vector<TensorSource> sources;
  if (weights.random_seed) {
    const DType dtype = weights.random_inits.at(wanted.begin()->first).dtype;
    for (TensorSource& source : random_checkpoint_tensors(weights.config, *weights.random_seed, dtype))
      if (wanted.contains(source.name)) sources.push_back(std::move(source));
    return sources;
  }
  for (const auto& [name, weight] : wanted) {
    const TensorView view = weight->weight;
    require(!weight->quantized(), "quantize: tensor \"{}\" is already quantized", name);
    sources.push_back(TensorSource{name, view.dtype, view.shape, [view](std::size_t offset, std::span<std::byte> out) {
                                     std::memcpy(out.data(), view.data + offset, out.size());
                                   }});
  }
  return sources;
}

std::size_t shape_bytes(const std::vector<int64_t>& shape, DType dtype) {
  std::size_t bytes = dtype_size(dtype);
  for (int64_t dim : shape) bytes *= static_cast<std::size_t>(dim);
  return bytes;
}

// Quantizes `sources` (float projections named as `wanted`'s keys) as weights.config.quantization says and points
// each projection of `wanted` at its quantized tensors. Each projection's codes and scales share one buffer of
// weights.slice_buffers, which lives as long as some copy of the weights points into it (BeamModel keeps one). Each
// band of weight rows is drawn and quantized once, for its codes and its scales together (a fill per stored tensor,
// as the streaming writer does, would do it twice), in tasks over every projection's bands at once, so that a model
// of many small experts spreads over the pool as well as one large projection does.
void store_quantized(BeamWeights& weights, const std::map<std::string, LinearWeight*, std::less<>>& wanted,
                     std::vector<TensorSource> sources) {
  constexpr std::size_t kAlign = 64;
  const QuantScheme scheme = quant_scheme_of(*weights.config.quantization);
  const auto aligned = [](std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  struct Projection {
    std::shared_ptr<ProjectionQuantizer> quantizer;
    QuantLayout layout;
    std::byte* codes = nullptr;
    std::byte* scales = nullptr;
    std::byte* scale_2 = nullptr;
  };
  struct Band {
    Projection* projection;
    int64_t first, count;
  };
  std::vector<Projection> projections;
  projections.reserve(sources.size());
  std::vector<Band> bands;
  const int64_t granularity = quant_row_granularity(scheme);
  for (TensorSource& source : sources) {
    auto quantizer = std::make_shared<ProjectionQuantizer>(std::move(source), scheme);
    const QuantLayout layout = quant_layout(scheme, quantizer->out(), quantizer->in());
    const std::size_t code_bytes = shape_bytes(layout.weight_shape, layout.weight_dtype);
    const std::size_t scale_bytes = shape_bytes(layout.scale_shape, layout.scale_dtype);
    auto buffer = std::make_shared<std::vector<std::byte>>(aligned(code_bytes) + aligned(scale_bytes) +
                                                           (layout.has_scale_2 ? sizeof(float) : 0));
    Projection& projection = projections.emplace_back(Projection{quantizer, layout, buffer->data(),
                                                                 buffer->data() + aligned(code_bytes), nullptr});
    if (layout.has_scale_2) projection.scale_2 = projection.scales + aligned(scale_bytes);
    weights.slice_buffers.push_back(std::move(buffer));
    const std::size_t granule_bytes = static_cast<std::size_t>(granularity) * code_bytes /
                                      static_cast<std::size_t>(quantizer->out());
    const int64_t rows = granularity * static_cast<int64_t>(
        std::max<std::size_t>(1, kFillTaskBytes / std::max<std::size_t>(1, granule_bytes)));
    for (int64_t first = 0; first < quantizer->out(); first += rows)
      bands.push_back({&projection, first, std::min(rows, quantizer->out() - first)});
  }
  ThreadPool::global().parallel_for(bands.size(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t b = begin; b < end; ++b) {
      const Band& band = bands[b];
      const Projection& projection = *band.projection;
      const QuantizedWeight quantized = projection.quantizer->quantize(band.first, band.count);
      const int64_t out = projection.quantizer->out();
      // Stored rows of codes follow weight rows one for one; fp8's scale rows cover 128 weight rows each.
      const std::size_t code_row = shape_bytes(projection.layout.weight_shape, projection.layout.weight_dtype) /
                                   static_cast<std::size_t>(out);
      const std::size_t scale_row = shape_bytes(projection.layout.scale_shape, projection.layout.scale_dtype) /
                                    static_cast<std::size_t>(projection.layout.scale_shape.at(0));
      const int64_t rows_per_scale_row = scheme == QuantScheme::Fp8Block ? kFp8BlockSize : 1;
      std::memcpy(projection.codes + static_cast<std::size_t>(band.first) * code_row, quantized.codes.data(),
                  quantized.codes.size());
      std::memcpy(projection.scales + static_cast<std::size_t>(band.first / rows_per_scale_row) * scale_row,
                  quantized.scales.data(), quantized.scales.size());
    }
  });
  for (Projection& projection : projections) {
    const ProjectionQuantizer& quantizer = *projection.quantizer;
    const std::string& name = quantizer.name();
    const std::string prefix = name.substr(0, name.size() - std::string_view(".weight").size());
    LinearWeight& weight = *wanted.at(name);
    const QuantLayout& layout = projection.layout;
    weight.weight = TensorView{name, layout.weight_dtype, layout.weight_shape, projection.codes,
                               shape_bytes(layout.weight_shape, layout.weight_dtype)};
    weight.scale = TensorView{prefix + "." + std::string(layout.scale_suffix), layout.scale_dtype, layout.scale_shape,
                              projection.scales, shape_bytes(layout.scale_shape, layout.scale_dtype)};
    if (layout.has_scale_2) {
      const float scale_2 = nvfp4_scale_2(projection.quantizer->amax());
      std::memcpy(projection.scale_2, &scale_2, sizeof scale_2);
      weight.scale_2 = TensorView{prefix + ".weight_scale_2", DType::F32, {}, projection.scale_2, sizeof scale_2};
    }
  }
}

}  // namespace

QuantizationConfig quantization_config_for(QuantScheme scheme, std::vector<std::string> modules_to_not_convert) {
  QuantizationConfig quant;
  quant.quant_method = std::string(quant_method_of(scheme));
  quant.quant_algo = std::string(quant_algo_of(scheme));
  if (scheme == QuantScheme::Fp8Block) quant.weight_block_size = {kFp8BlockSize, kFp8BlockSize};
  quant.ignored_layers = std::move(modules_to_not_convert);
  return quant;
}

QuantScheme quant_scheme_of(const QuantizationConfig& quant) {
  const std::optional<QuantScheme> scheme = quant_scheme_from_method(quant.quant_method, quant.quant_algo);
  require(scheme.has_value(), "quantization_config: quant_method \"{}\" (quant_algo \"{}\") is not a layout beamline "
          "computes with", quant.quant_method, quant.quant_algo);
  return *scheme;
}

QuantScheme parse_quantization_flag(std::string_view name) {
  const std::optional<QuantScheme> scheme = quant_scheme_from_name(name);
  require(scheme.has_value(), "--quantization: \"{}\" is not one of fp8, mxfp8, nvfp4", name);
  return *scheme;
}

std::vector<TensorSource> quantized_sources(const ModelConfig& config, std::vector<TensorSource> tensors,
                                            const QuantizationConfig& quant) {
  const QuantScheme scheme = quant_scheme_of(quant);
  std::map<std::string, TensorRole, std::less<>> roles;
  for (const ExpectedTensor& expected : expected_tensors(config)) roles.emplace(expected.name, expected.role);
  std::vector<TensorSource> result;
  for (TensorSource& tensor : tensors) {
    const auto role = roles.find(tensor.name);
    if (role == roles.end() || role->second != TensorRole::Projection || ignored(quant, tensor.name)) {
      result.push_back(std::move(tensor));
      continue;
    }
    for (TensorSource& part : quantized_tensors(std::move(tensor), scheme)) result.push_back(std::move(part));
  }
  return result;
}

BeamWeights quantize_weights(BeamWeights weights, const QuantizationConfig& quant,
                             const std::optional<ModelShard>& shard) {
  std::map<std::string, LinearWeight*, std::less<>> wanted;
  for (const auto& [name, weight] : projections(weights, shard.value_or(ModelShard::whole(weights.config))))
    if (!ignored(quant, name)) wanted.emplace(name, weight);
  weights.config.quantization = quant;
  if (wanted.empty()) return weights;
  store_quantized(weights, wanted, float_projection_sources(weights, wanted));
  return weights;
}

BeamWeights with_quantized_projections(BeamWeights weights, std::span<const TensorView> float_projections) {
  if (float_projections.empty()) return weights;
  require(weights.config.quantization.has_value(), "quantize: the model is not served quantized (no quantization_config)");
  const QuantScheme scheme = quant_scheme_of(*weights.config.quantization);
  const std::map<std::string, LinearWeight*, std::less<>> all = projections(weights, ModelShard::whole(weights.config));
  std::map<std::string, LinearWeight*, std::less<>> wanted;
  std::vector<TensorSource> sources;
  for (const TensorView& view : float_projections) {
    const auto found = all.find(view.name);
    require(found != all.end(), "quantize: tensor \"{}\" is not a projection of this model", view.name);
    const TensorView& served = found->second->weight;
    require(found->second->quantized(), "quantize: tensor \"{}\" is served unquantized", view.name);
    require(view.shape.size() == 2 &&
                quant_layout(scheme, view.shape[0], view.shape[1]).weight_shape == served.shape,
            "quantize: tensor \"{}\": shape {} does not quantize to the served {} {}", view.name,
            shape_string(view.shape), dtype_name(served.dtype), shape_string(served.shape));
    require(wanted.emplace(view.name, found->second).second, "quantize: tensor \"{}\" is given twice", view.name);
    sources.push_back(TensorSource{view.name, view.dtype, view.shape, [view](std::size_t offset, std::span<std::byte> out) {
                                     std::memcpy(out.data(), view.data + offset, out.size());
                                   }});
  }
  store_quantized(weights, wanted, std::move(sources));
  return weights;
}

}  // namespace beamline

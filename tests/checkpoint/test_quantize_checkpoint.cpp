// Quantized checkpoints (checkpoint/quantize_tensors.h): the streamed bands equal the whole tensor's quantization,
// only projections are converted, --quantization at load (online, dummy, contradicting the checkpoint), and the
// loader's refusal of malformed quantized layouts, each naming the tensor and what was expected.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/model_source.h"
#include "checkpoint/presets.h"
#include "checkpoint/quantize_tensors.h"
#include "quant/quantize.h"
#include "util/error.h"
#include "../model/model_test_support.h"

namespace beamline {
namespace {

constexpr QuantScheme kSchemes[] = {QuantScheme::Fp8Block, QuantScheme::Mxfp8, QuantScheme::Nvfp4};

std::vector<std::byte> bytes_of(const TensorSource& source, std::size_t piece) {
  std::vector<std::byte> bytes(source.nbytes());
  for (std::size_t offset = 0; offset < bytes.size(); offset += piece)
    source.fill(offset, std::span<std::byte>(bytes.data() + offset, std::min(piece, bytes.size() - offset)));
  return bytes;
}

const TensorSource& find(const std::vector<TensorSource>& tensors, const std::string& name) {
  for (const TensorSource& tensor : tensors)
    if (tensor.name == name) return tensor;
  throw std::runtime_error("no tensor " + name);
}

void write_checkpoint(const ModelConfig& config, const std::filesystem::path& dir, std::vector<TensorSource> tensors) {
  write_model_files(config, dir);
  write_safetensors_checkpoint(dir, tensors);
}

void expect_error(const std::function<void()>& body, const std::vector<std::string>& texts) {
  try {
    body();
    FAIL() << "no error; expected one containing \"" << texts.front() << "\"";
  } catch (const Error& error) {
    for (const std::string& text : texts)
      EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << "missing \"" << text << "\" in: " << error.what();
  }
}

// A [1100, 4096] lm_head spans two quantization bands (16 MiB of F32 each): written in 1 MiB pieces, as the writer
// asks for them, and in small odd pieces, its tensors are byte for byte the whole matrix's quantization.
TEST(QuantizedSources, BandsEqualTheWholeTensorsQuantization) {
  ModelConfig config = preset_config("tiny");
  config.vocab_size = 1100;
  config.hidden_size = 4096;
  config.tie_word_embeddings = false;
  std::mt19937_64 engine(5);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<std::size_t>(1100 * 4096));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = normal(engine) * (i / 4096 % 300 == 7 ? 50.0f : 1.0f);
  const TensorSource head = tensor_from_floats("lm_head.weight", DType::BF16, {1100, 4096}, values);
  for (float& v : values) v = bf16_to_f32(f32_to_bf16(v));
  for (QuantScheme scheme : kSchemes) {
    SCOPED_TRACE(std::string(quant_scheme_name(scheme)));
    const QuantizedWeight expected = quantize_weight(scheme, values, 1100, 4096);
    const QuantLayout layout = quant_layout(scheme, 1100, 4096);
    const std::vector<TensorSource> parts = quantized_sources(config, {head}, quantization_config_for(scheme, {}));
    ASSERT_EQ(parts.size(), layout.has_scale_2 ? 3u : 2u);
    EXPECT_EQ(parts[0].name, "lm_head.weight");
    EXPECT_EQ(parts[0].dtype, layout.weight_dtype);
    EXPECT_EQ(parts[0].shape, layout.weight_shape);
    EXPECT_EQ(parts[1].name, "lm_head." + std::string(layout.scale_suffix));
    EXPECT_EQ(parts[1].dtype, layout.scale_dtype);
    EXPECT_EQ(parts[1].shape, layout.scale_shape);
    const auto as_bytes = [](const std::vector<uint8_t>& v) {
      std::vector<std::byte> out(v.size());
      std::memcpy(out.data(), v.data(), v.size());
      return out;
    };
    EXPECT_TRUE(bytes_of(parts[0], std::size_t{1} << 20) == as_bytes(expected.codes));
    EXPECT_TRUE(bytes_of(parts[0], 999'983) == as_bytes(expected.codes));
    EXPECT_TRUE(bytes_of(parts[1], std::size_t{1} << 20) == as_bytes(expected.scales));
    EXPECT_TRUE(bytes_of(parts[1], 4 * 7) == as_bytes(expected.scales));
    if (layout.has_scale_2) {
      EXPECT_EQ(parts[2].name, "lm_head.weight_scale_2");
      float scale_2 = 0.0f;
      parts[2].fill(0, std::span<std::byte>(reinterpret_cast<std::byte*>(&scale_2), 4));
      EXPECT_EQ(scale_2, expected.scale_2);
    }
  }
}

TEST(QuantizedSources, OnlyProjectionsOutsideTheIgnoredPrefixesAreConverted) {
  const ModelConfig config = preset_config("tiny");
  const std::vector<TensorSource> parts =
      quantized_sources(config, random_checkpoint_tensors(config, 1, DType::BF16),
                        quantization_config_for(QuantScheme::Nvfp4, {"lm_head", "model.layers.0.mlp"}));
  EXPECT_EQ(find(parts, "model.embed_tokens.weight").dtype, DType::BF16);
  EXPECT_EQ(find(parts, "lm_head.weight").dtype, DType::BF16);
  EXPECT_EQ(find(parts, "model.norm.weight").dtype, DType::BF16);
  EXPECT_EQ(find(parts, "model.layers.0.mlp.up_proj.weight").dtype, DType::BF16);
  EXPECT_EQ(find(parts, "model.layers.0.self_attn.q_proj.weight").dtype, DType::U8);
  EXPECT_EQ(find(parts, "model.layers.2.mlp.gate.weight").dtype, DType::F32);
  EXPECT_EQ(find(parts, "model.layers.2.mlp.gate.e_score_correction_bias").dtype, DType::F32);
  EXPECT_EQ(find(parts, "model.layers.2.mlp.experts.3.down_proj.weight_scale").dtype, DType::F8_E4M3);
  EXPECT_EQ(find(parts, "model.layers.2.mlp.experts.3.down_proj.weight_scale_2").shape, std::vector<int64_t>{});
}

// A written quantized checkpoint, the same model quantized at load, and --load-format dummy quantized at load all
// hold the same bytes, so their logits are equal; and they stay near the BF16 model's.
TEST(QuantizeAtLoad, CheckpointOnlineAndDummyAgree) {
  const ModelConfig config = preset_config("tiny");
  const std::vector<int32_t> tokens{3, 17, 250, 4, 99, 12, 7, 300};
  testing::TempDir bf16_dir("bf16"), quantized_dir("quantized");
  write_random_checkpoint(config, bf16_dir.path(), 11, DType::BF16);
  const std::vector<float> reference = testing::cpu_prefill_logits(load_checkpoint(bf16_dir.path()), tokens);
  for (QuantScheme scheme : kSchemes) {
    const std::string name(quant_scheme_name(scheme));
    SCOPED_TRACE(name);
    ModelConfig quantized_config = config;
    quantized_config.quantization = quantization_config_for(scheme, {"lm_head"});
    write_checkpoint(quantized_config, quantized_dir.path(),
                     quantized_sources(quantized_config, random_checkpoint_tensors(config, 11, DType::BF16),
                                       *quantized_config.quantization));
    const BeamWeights written = load_checkpoint(quantized_dir.path());
    EXPECT_TRUE(written.layers[0].q_proj.quantized());
    EXPECT_FALSE(written.lm_head.quantized());
    const std::vector<float> from_checkpoint = testing::cpu_prefill_logits(written, tokens);

    ModelSource online{bf16_dir.path().string()};
    online.quantization = name;
    const BeamWeights online_weights = online.load();
    ASSERT_TRUE(online_weights.config.quantization);
    EXPECT_EQ(online_weights.config.quantization->quant_method, written.config.quantization->quant_method);
    EXPECT_EQ(testing::cpu_prefill_logits(online_weights, tokens), from_checkpoint);

    ModelSource dummy_from_bf16{bf16_dir.path().string(), "dummy"};
    dummy_from_bf16.dummy_seed = 11;
    dummy_from_bf16.quantization = name;
    EXPECT_EQ(testing::cpu_prefill_logits(dummy_from_bf16.load(), tokens), from_checkpoint);
    // A config that already says `scheme` (make-model --no-weights --quantization): drawn, then quantized as it says.
    ModelSource dummy_from_config{quantized_dir.path().string(), "dummy"};
    dummy_from_config.dummy_seed = 11;
    EXPECT_EQ(testing::cpu_prefill_logits(dummy_from_config.load(), tokens), from_checkpoint);

    double largest = 0.0;
    for (std::size_t i = 0; i < reference.size(); ++i)
      largest = std::max(largest, std::abs(double{from_checkpoint[i]} - reference[i]));
    double reference_largest = 0.0;
    for (float v : reference) reference_largest = std::max(reference_largest, std::abs(double{v}));
    // A sanity bound on a random (untrained, so sensitive) model: measured 16% (fp8), 6% (mxfp8), 34% (nvfp4).
    EXPECT_GT(largest, 0.0);
    EXPECT_LT(largest, (scheme == QuantScheme::Nvfp4 ? 0.5 : 0.25) * reference_largest);
  }
}

// A rank of a distributed run (ModelSource::parallel) quantizes at load only what it computes: its stage's layers and
// its experts, each with the bytes one process quantizes; the rest stays float (never loaded there).
TEST(QuantizeAtLoad, ARankQuantizesOnlyItsShard) {
  const ModelConfig config = preset_config("tiny");
  ParallelConfig parallel;
  parallel.pipeline = 2;
  parallel.tensor = 2;
  parallel.expert = true;
  ModelSource whole{"tiny", "dummy"};
  whole.quantization = "nvfp4";
  const BeamWeights reference = whole.load();
  ModelSource rank = whole;
  rank.parallel = parallel;
  rank.world_rank = 3;  // stage 1 (layers 3-5), tensor rank 1 (experts 4-7)
  const BeamWeights weights = rank.load();
  const auto bytes = [](const TensorView& view) {
    return std::vector<std::byte>(view.data, view.data + view.nbytes);
  };
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const LayerWeights& layer = weights.layers[static_cast<std::size_t>(i)];
    SCOPED_TRACE("layer " + std::to_string(i));
    EXPECT_EQ(layer.q_proj.quantized(), i >= 3);
    for (std::size_t e = 0; e < layer.experts.size(); ++e) {
      const LinearWeight& down = layer.experts[e].down_proj;
      EXPECT_EQ(down.quantized(), i >= 3 && e >= 4) << "expert " << e;
      if (!down.quantized()) continue;
      const LinearWeight& expected = reference.layers[static_cast<std::size_t>(i)].experts[e].down_proj;
      EXPECT_EQ(bytes(down.weight), bytes(expected.weight));
      EXPECT_EQ(bytes(down.scale), bytes(expected.scale));
      EXPECT_EQ(bytes(down.scale_2), bytes(expected.scale_2));
    }
  }
}

// Quantize-at-load draws and quantizes each band of weight rows once for its codes and scales together; the writer
// (quantized_sources, `beamline quantize`) fills each stored tensor on its own. Both give the same bytes, here with
// projections of several bands (a dense MLP of 2,560 x 520: 1.3 MiB of FP8 codes, fp8's last scale column cut short)
// and fp8's experts of 200 rows (the last scale row cut short).
TEST(QuantizeAtLoad, EveryTensorHasTheWritersBytes) {
  ModelConfig config = preset_config("tiny");
  config.hidden_size = 520;
  config.intermediate_size = 2560;
  config.moe_intermediate_size = 200;
  for (QuantScheme scheme : kSchemes) {
    const std::string name(quant_scheme_name(scheme));
    SCOPED_TRACE(name);
    if (scheme != QuantScheme::Fp8Block) {  // mxfp8 and nvfp4 take whole groups of inputs
      config.hidden_size = 512;
      config.moe_intermediate_size = 224;
    }
    const QuantizationConfig quant = quantization_config_for(scheme, {"lm_head"});
    std::map<std::string, std::vector<std::byte>> written;
    for (const TensorSource& part : quantized_sources(config, random_checkpoint_tensors(config, 5, DType::BF16), quant)) {
      std::vector<std::byte> bytes(part.nbytes());
      part.fill(0, bytes);
      written.emplace(part.name, std::move(bytes));
    }
    const BeamWeights loaded = quantize_weights(dummy_weights(config, 5, DType::BF16), quant);
    const auto expect_written = [&](const TensorView& view) {
      if (view.data == nullptr) return;
      SCOPED_TRACE(view.name);
      ASSERT_TRUE(written.contains(view.name));
      EXPECT_EQ(std::vector<std::byte>(view.data, view.data + view.nbytes), written.at(view.name));
    };
    std::size_t checked = 0;
    for (const LayerWeights& layer : loaded.layers) {
      std::vector<const ExpertWeights*> mlps;
      if (layer.mlp) mlps.push_back(&*layer.mlp);
      for (const ExpertWeights& expert : layer.experts) mlps.push_back(&expert);
      for (const LinearWeight* weight : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj}) {
        ASSERT_TRUE(weight->quantized());
        for (const TensorView* view : {&weight->weight, &weight->scale, &weight->scale_2}) expect_written(*view);
        ++checked;
      }
      for (const ExpertWeights* mlp : mlps)
        for (const LinearWeight* weight : {&mlp->gate_proj, &mlp->up_proj, &mlp->down_proj}) {
          ASSERT_TRUE(weight->quantized());
          for (const TensorView* view : {&weight->weight, &weight->scale, &weight->scale_2}) expect_written(*view);
          ++checked;
        }
    }
    EXPECT_GT(checked, 0u);
  }
}

TEST(QuantizeAtLoad, ContradictingTheCheckpointIsRefusedNamingBoth) {
  const ModelConfig config = preset_config("tiny");
  testing::TempDir dir("fp8");
  ModelConfig quantized_config = config;
  quantized_config.quantization = quantization_config_for(QuantScheme::Fp8Block, {"lm_head"});
  write_checkpoint(quantized_config, dir.path(),
                   quantized_sources(quantized_config, random_checkpoint_tensors(config, 2, DType::BF16),
                                     *quantized_config.quantization));
  ModelSource source{dir.path().string()};
  source.quantization = "nvfp4";
  expect_error([&] { source.load(); }, {"--quantization nvfp4", "quant_method \"fp8\"", "fp8)"});
  source.quantization = "fp8";
  EXPECT_TRUE(source.load().layers[1].o_proj.quantized());
  source.quantization = "int4";
  expect_error([&] { source.load(); }, {"--quantization", "\"int4\""});
}

// Malformed quantized checkpoints: each refused naming the tensor and what it should have been.
TEST(QuantizedCheckpoint, MalformedScalesAreRefusedNamingTheTensor) {
  const ModelConfig config = preset_config("tiny");
  testing::TempDir dir("malformed");
  const auto write_with = [&](QuantScheme scheme, const std::string& replaced, TensorSource replacement) {
    ModelConfig quantized_config = config;
    quantized_config.quantization = quantization_config_for(scheme, {});
    std::vector<TensorSource> tensors = quantized_sources(
        quantized_config, random_checkpoint_tensors(config, 3, DType::BF16), *quantized_config.quantization);
    for (TensorSource& tensor : tensors)
      if (tensor.name == replaced) tensor = std::move(replacement);
    write_checkpoint(quantized_config, dir.path(), tensors);
  };
  const auto load = [&] { load_checkpoint(dir.path()); };

  const std::string nvfp4_scale_2 = "model.layers.1.self_attn.k_proj.weight_scale_2";
  write_with(QuantScheme::Nvfp4, nvfp4_scale_2, tensor_from_floats(nvfp4_scale_2, DType::F32, {1}, {1.0f}));
  expect_error(load, {"\"" + nvfp4_scale_2 + "\"", "expected shape [], found [1]"});

  const std::string mxfp8_scale = "model.layers.2.mlp.experts.0.up_proj.weight_scale";
  write_with(QuantScheme::Mxfp8, mxfp8_scale, tensor_from_floats(mxfp8_scale, DType::F32, {32, 2}, std::vector<float>(64)));
  expect_error(load, {"\"" + mxfp8_scale + "\"", "dtype F32 is not allowed", "E8M0"});

  // Scales of another block size: fp8's [ceil(out/128), ceil(in/128)] is [1, 1] for every tiny projection.
  const std::string fp8_scale = "model.layers.0.mlp.down_proj.weight_scale_inv";
  write_with(QuantScheme::Fp8Block, fp8_scale, tensor_from_floats(fp8_scale, DType::F32, {1, 2}, {1.0f, 1.0f}));
  expect_error(load, {"\"" + fp8_scale + "\"", "expected shape [1, 1], found [1, 2]"});

  // A weight_block_size other than [128, 128] in the config.
  write_with(QuantScheme::Fp8Block, "", {});
  nlohmann::json document = ModelConfig::load(dir.path() / "config.json").to_json();
  document["quantization_config"]["weight_block_size"] = {64, 64};
  write_text_file(dir.path() / "config.json", document.dump());
  expect_error(load, {"quantization_config.weight_block_size", "must be [128, 128]"});
}

}  // namespace
}  // namespace beamline

// with_received_tensors (weight sync from a trainer, docs/rl.md): the served weights with the received tensors in
// their place give the logits of the checkpoint those tensors came from, bit for bit (a quantized server: those of
// that checkpoint quantized at load); bad tensors are refused naming them, and the served weights are never touched.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "backend/backend.h"
#include "backend/registry.h"
#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "checkpoint/quantize_tensors.h"
#include "checkpoint/safetensors.h"
#include "model/beam_model.h"
#include "../model/model_test_support.h"
#include "runner/sequence_runner.h"
#include "util/error.h"

namespace beamline {
namespace {

const std::vector<int32_t> kTokens{3, 17, 250, 4, 99, 12, 7, 300};

std::vector<float> prefill_logits(const BeamWeights& weights) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  BeamModel model(weights, *backend);
  SequenceRunner runner(model, static_cast<int64_t>(kTokens.size()), static_cast<int64_t>(kTokens.size()));
  return runner.step(kTokens, true);
}

// A tensor as a trainer would send it: its bytes copied into memory of their own.
HostTensor received(const TensorView& view) {
  auto bytes = std::make_shared<std::vector<std::byte>>(view.data, view.data + view.nbytes);
  return {TensorView{view.name, view.dtype, view.shape, bytes->data(), bytes->size()}, std::move(bytes)};
}

HostTensor zeros(std::string name, DType dtype, std::vector<int64_t> shape) {
  TensorView view{std::move(name), dtype, std::move(shape), nullptr, 0};
  view.nbytes = static_cast<std::size_t>(view.numel()) * dtype_size(dtype);
  auto bytes = std::make_shared<std::vector<std::byte>>(view.nbytes);
  view.data = bytes->data();
  return {std::move(view), std::move(bytes)};
}

void expect_refused(const BeamWeights& served, const std::vector<HostTensor>& tensors, const std::string& fragment) {
  try {
    (void)with_received_tensors(served, tensors);
    ADD_FAILURE() << "accepted; expected an error containing: " << fragment;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(ReceivedTensors, EveryTensorOfAnotherCheckpointGivesItsLogits) {
  testing::TempDir dir("received");
  const ModelConfig config = preset_config("tiny");
  const BeamWeights next = testing::write_and_load(config, dir.path(), 8);
  // Served: random weights drawn by the backend (no host bytes), so every tensor must come from the update.
  const BeamWeights served = dummy_weights(config, 7);
  const std::vector<float> before = prefill_logits(served);
  std::vector<HostTensor> tensors;
  for (const std::string& name : next.archive->tensor_names()) tensors.push_back(received(next.archive->at(name)));
  // Half, then the rest: two updates as a trainer sends buckets.
  const std::size_t half = tensors.size() / 2;
  const BeamWeights mixed = with_received_tensors(served, std::span(tensors).first(half));
  const BeamWeights updated = with_received_tensors(mixed, std::span(tensors).subspan(half));
  tensors.clear();  // the result keeps the bytes alive
  const std::vector<float> expected = prefill_logits(next), got = prefill_logits(updated);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)));
  // The served weights are untouched.
  const std::vector<float> again = prefill_logits(served);
  EXPECT_EQ(0, std::memcmp(again.data(), before.data(), before.size() * sizeof(float)));
}

// Weight sync into a server quantized at load (--quantization fp8 / mxfp8 / nvfp4, MXFP8 rollouts): the trainer's
// BF16 tensors, quantized on arrival, give what a server started from them with the same --quantization holds, byte
// for byte, and so its logits bit for bit.
TEST(ReceivedTensors, AQuantizedServerQuantizesOnArrivalAsAtLoad) {
  testing::TempDir first_dir("first"), next_dir("next");
  const ModelConfig config = preset_config("tiny");
  const BeamWeights first = testing::write_and_load(config, first_dir.path(), 8);
  const BeamWeights next = testing::write_and_load(config, next_dir.path(), 9);
  for (QuantScheme scheme : {QuantScheme::Fp8Block, QuantScheme::Mxfp8, QuantScheme::Nvfp4}) {
    SCOPED_TRACE(std::string(quant_scheme_name(scheme)));
    const QuantizationConfig quant = quantization_config_for(scheme, {"lm_head"});
    const BeamWeights served = quantize_weights(first, quant);
    const BeamWeights at_load = quantize_weights(next, quant);
    std::vector<HostTensor> tensors;
    for (const std::string& name : next.archive->tensor_names()) tensors.push_back(received(next.archive->at(name)));
    const std::size_t half = tensors.size() / 2;  // two buckets, as a trainer sends them
    BeamWeights updated = with_received_tensors(served, std::span(tensors).first(half));
    updated = with_received_tensors(updated, std::span(tensors).subspan(half));
    tensors.clear();
    ASSERT_TRUE(updated.layers[0].q_proj.quantized());
    ASSERT_FALSE(updated.lm_head.quantized());
    const std::vector<const TensorView*> got = updated.views(), expected = at_load.views();
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i]->name, expected[i]->name);
      ASSERT_EQ(got[i]->dtype, expected[i]->dtype) << got[i]->name;
      ASSERT_EQ(got[i]->nbytes, expected[i]->nbytes) << got[i]->name;
      ASSERT_EQ(0, std::memcmp(got[i]->data, expected[i]->data, got[i]->nbytes)) << got[i]->name;
    }
    if (scheme == QuantScheme::Nvfp4) {
      const TensorView &got_2 = updated.layers[1].o_proj.scale_2, &expected_2 = at_load.layers[1].o_proj.scale_2;
      ASSERT_NE(got_2.data, nullptr);
      EXPECT_EQ(0, std::memcmp(got_2.data, expected_2.data, sizeof(float)));
    }
    const std::vector<float> want = prefill_logits(at_load), have = prefill_logits(updated);
    ASSERT_EQ(have.size(), want.size());
    EXPECT_EQ(0, std::memcmp(have.data(), want.data(), have.size() * sizeof(float)));
    // Only the new quantized bytes and the received float tensors in use stay: the served model's go with it.
    EXPECT_LE(updated.slice_buffers.size(), next.views().size());
  }
}

// /update_weights_from_disk into a server quantized at load: a float directory is quantized as at load (the same
// bytes); a directory of another scheme is refused naming both.
TEST(ReceivedTensors, AQuantizedServerTakesAFloatDirectoryAsAtLoad) {
  testing::TempDir first_dir("first"), next_dir("next"), other_dir("other");
  const ModelConfig config = preset_config("tiny");
  const BeamWeights first = testing::write_and_load(config, first_dir.path(), 8);
  const BeamWeights next = testing::write_and_load(config, next_dir.path(), 9);
  const QuantizationConfig quant = quantization_config_for(QuantScheme::Mxfp8, {"lm_head"});
  const BeamWeights served = quantize_weights(first, quant);
  const BeamWeights updated = load_weight_update(next_dir.path(), served.config);
  const BeamWeights at_load = quantize_weights(next, quant);
  ASSERT_TRUE(updated.config.quantization.has_value());
  const std::vector<const TensorView*> got = updated.views(), expected = at_load.views();
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i]->name, expected[i]->name);
    ASSERT_EQ(got[i]->nbytes, expected[i]->nbytes) << got[i]->name;
    ASSERT_EQ(0, std::memcmp(got[i]->data, expected[i]->data, got[i]->nbytes)) << got[i]->name;
  }
  ModelConfig nvfp4 = config;
  nvfp4.quantization = quantization_config_for(QuantScheme::Nvfp4, {"lm_head"});
  write_model_files(nvfp4, other_dir.path());
  write_safetensors_checkpoint(other_dir.path(), quantized_sources(nvfp4, random_checkpoint_tensors(config, 9, DType::BF16),
                                                                   *nvfp4.quantization));
  try {
    (void)load_weight_update(other_dir.path(), served.config);
    ADD_FAILURE() << "an nvfp4 directory was taken by an mxfp8 server";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("served quantized as mxfp8"), std::string::npos) << error.what();
  }
}

TEST(ReceivedTensors, ARouterInBf16IsWidenedExactly) {
  const ModelConfig config = preset_config("tiny");
  const BeamWeights served = dummy_weights(config, 7);
  const std::string name = "model.layers." + std::to_string(config.first_k_dense_replace) + ".mlp.gate.weight";
  HostTensor router = zeros(name, DType::BF16, {config.n_routed_experts, config.hidden_size});
  auto* bits = reinterpret_cast<uint16_t*>(const_cast<std::byte*>(router.view.data));
  for (int64_t i = 0; i < router.view.numel(); ++i) bits[i] = f32_to_bf16(0.01f * static_cast<float>(i % 97) - 0.4f);
  const BeamWeights updated = with_received_tensors(served, std::vector<HostTensor>{router});
  const TensorView& widened = updated.layers.at(static_cast<std::size_t>(config.first_k_dense_replace)).router;
  ASSERT_EQ(widened.dtype, DType::F32);
  for (int64_t i = 0; i < widened.numel(); ++i) ASSERT_EQ(widened.as<float>()[i], bf16_to_f32(bits[i])) << i;
}

TEST(ReceivedTensors, ReplacedBytesAreLetGo) {
  const ModelConfig config = preset_config("tiny");
  const std::string norm = "model.layers.0.input_layernorm.weight";
  BeamWeights weights = dummy_weights(config, 7);
  for (int update = 0; update < 3; ++update)
    weights = with_received_tensors(weights, std::vector<HostTensor>{zeros(norm, DType::BF16, {config.hidden_size})});
  EXPECT_EQ(weights.slice_buffers.size(), 1u);
}

TEST(ReceivedTensors, BadTensorsAreRefusedNamingThem) {
  const ModelConfig config = preset_config("tiny");
  const BeamWeights served = dummy_weights(config, 7);
  const int64_t hidden = config.hidden_size;
  const std::string norm = "model.layers.0.input_layernorm.weight";
  expect_refused(served, {zeros("model.layers.0.self_attn.q_proj.lora_A.weight", DType::BF16, {4, hidden})},
                 "tensor \"model.layers.0.self_attn.q_proj.lora_A.weight\" is not a tensor of this model");
  expect_refused(served, {zeros(norm, DType::BF16, {hidden + 1})},
                 "tensor \"" + norm + "\": expected shape [" + std::to_string(hidden) + "], got [" +
                     std::to_string(hidden + 1) + "]");
  expect_refused(served, {zeros(norm, DType::I32, {hidden})}, "tensor \"" + norm + "\": dtype I32 is not allowed");
  expect_refused(served, {zeros(norm, DType::BF16, {hidden}), zeros(norm, DType::F32, {hidden})},
                 "tensor \"" + norm + "\" is sent twice");
}

}  // namespace
}  // namespace beamline

#include "model/weights.h"

namespace beamline {

std::vector<const TensorView*> BeamWeights::views() const {
  std::vector<const TensorView*> all;
  auto add = [&](const TensorView& view) {
    if (!view.shape.empty()) all.push_back(&view);
  };
  auto add_linear = [&](const LinearWeight& weight) {
    add(weight.weight);
    if (weight.scale.data != nullptr) add(weight.scale);
    if (weight.scale_2.data != nullptr) add(weight.scale_2);
  };
  add(embed_tokens);
  add(norm);
  add_linear(lm_head);
  for (const LayerWeights& layer : layers) {
    for (const TensorView* view : {&layer.input_layernorm, &layer.post_attention_layernorm,
                                   &layer.pre_feedforward_layernorm, &layer.post_feedforward_layernorm,
                                   &layer.router, &layer.router_bias})
      add(*view);
    for (const LinearWeight* weight : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj}) add_linear(*weight);
    std::vector<const ExpertWeights*> mlps;
    if (layer.mlp) mlps.push_back(&*layer.mlp);
    for (const ExpertWeights& expert : layer.experts) mlps.push_back(&expert);
    for (const ExpertWeights* mlp : mlps)
      for (const LinearWeight* weight : {&mlp->gate_proj, &mlp->up_proj, &mlp->down_proj}) add_linear(*weight);
  }
  return all;
}

}  // namespace beamline

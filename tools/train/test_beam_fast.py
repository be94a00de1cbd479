#!/usr/bin/env python3
"""beam_fast.fast_loss against the reference (beam_torch's forward + train.py's loss), float32 on the CPU:
the same loss and the same gradient of every parameter, and the same expert loads.

  /usr/bin/python3 tools/train/test_beam_fast.py

Float32 within 1e-4 relative, and under bf16 autocast within 2e-2. A small Beam (every feature: dense and MoE
layers, group-limited routing, sliding RoPE and full SSMax layers, GQA) with random norm weights and router biases,
on right-padded rows longer and shorter than the sliding window (one, two and several window-sized blocks, a
length that is a multiple of the window and lengths that are not), with the loss's targets chosen in the step
(nonzero) or passed in from the host (as train.py's collation does). Under bf16 a near-tie may route a token to
another expert (the wide-SwiGLU sum rounds once, the reference per expert): loads are reported, not required equal,
and the gradient is compared as a whole.
On a GPU, train.py runs beam_fast.check_against_reference() before training (float32 there too).
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "reference"))
import beam_fast  # noqa: E402
from beam_config import BeamConfig  # noqa: E402
from beam_torch import BeamForCausalLM, init_weights, randomize_for_checks  # noqa: E402


def small_config():
    layers = 4
    return {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "moe_intermediate_size": 32,
            "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4,
            "topk_group": 2, "routed_scaling_factor": 2.5, "layer_types": ["sliding_attention", "full_attention",
                                                                            "sliding_attention", "full_attention"],
            "sliding_window": 16, "ssmax_base": 32.0, "ssmax_exponent": 0.1, "final_logit_softcapping": 30.0}


def random_model(config, seed):
    model = BeamForCausalLM(BeamConfig(config))
    init_weights(model, seed)
    randomize_for_checks(model, seed + 1)
    return model


def batch(vocab, lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    T = max(lengths)
    tokens = torch.zeros(len(lengths), T, dtype=torch.long)
    loss_mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    valid = torch.zeros(len(lengths), T, dtype=torch.bool)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(0, vocab, (n,), generator=generator)
        loss_mask[row, :n] = torch.rand(n, generator=generator) < 0.6
        valid[row, :n] = True
    return tokens, loss_mask, valid


def main():
    torch.manual_seed(0)
    failures = 0
    config = small_config()
    for seed, lengths in [(1, [40, 33, 17, 40]), (2, [12, 9]), (3, [64, 50, 61]), (4, [20, 17, 3])]:
        model = random_model(config, seed)
        failures += not beam_fast.check_against_reference(model, *batch(config["vocab_size"], lengths, seed))
    # the targets as train.py passes them (host side) give the same loss as the ones the step picks itself
    model = random_model(config, 5)
    tokens, loss_mask, valid = batch(config["vocab_size"], [40, 26], 5)
    passed = float(beam_fast.fast_loss(model, tokens, loss_mask, valid, beam_fast.target_positions(loss_mask)))
    chosen = float(beam_fast.fast_loss(model, tokens, loss_mask, valid))
    print(f"targets from the host: loss {passed:.6f} vs {chosen:.6f}: {'ok' if passed == chosen else 'MISMATCH'}")
    failures += passed != chosen
    # bf16 autocast (as training runs): the loss and gradients within bf16 rounding (the reference rounds attention
    # scores to bf16, SDPA keeps them in float32)
    model = random_model(config, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        failures += not beam_fast.check_against_reference(model, *batch(config["vocab_size"], [40, 33, 17, 40], 1),
                                                          tolerance=2e-2, exact_routing=False)
    print("FAILED" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

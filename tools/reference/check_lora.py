#!/usr/bin/env python3
"""LoRA adapters against the NumPy reference: what `beamline serve --enable-lora` returns for a request naming an
adapter equals beam_numpy.py's model with the adapter merged into its weights (W + scale * B A, float64).

  python3 tools/reference/check_lora.py [--beamline build/apps/beamline/beamline] [--device cpu]

A random tiny checkpoint and two random PEFT adapters (adapter_model.safetensors in F32) on q/k/v/o of two layers, the
dense MLP and every expert of one MoE layer (docs/lora.md): one with use_rslora at rank 8 everywhere, one with its
experts at their true rank r / top_k = 4 (rank_pattern), each module scaled by lora_alpha over its own rank. Checks
prompt_logprobs (top 3) of each adapter's requests against its merged reference within --tolerance, and the base
model's against the unmerged one in the same server.
"""
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import beam_numpy  # noqa: E402
import safetensors_io  # noqa: E402
from beamline_server import Server, check_parser, make_tiny_model, post  # noqa: E402
from check_prompt_logprobs import check, log_softmax  # noqa: E402


def write_adapter(directory, tensors, modules, rank, alpha, rslora, rng, expert_rank=None):
    """A PEFT adapter over `modules` of the checkpoint `tensors`, the experts at `expert_rank` (a rank_pattern entry)
    when given; returns {module: (A, B, scale)}, the scale lora_alpha over the module's own rank (its root with
    rsLoRA), as PEFT and Megatron-Bridge scale a rank_pattern / normalize_moe_lora rank."""
    os.makedirs(directory)
    targets = sorted({module.rsplit(".", 1)[1] for module in modules})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora, "target_modules": targets,
              "bias": "none"}
    if expert_rank is not None:
        config["rank_pattern"] = {r"mlp\.experts\.\d+\.\w+": expert_rank}
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    out, adapter = {}, {}
    for module in modules:
        rows, cols = tensors[module + ".weight"].shape
        own = expert_rank if expert_rank is not None and ".experts." in module else rank
        a = (0.3 * rng.standard_normal((own, cols))).astype(np.float32)
        b = (0.05 * rng.standard_normal((rows, own))).astype(np.float32)
        out[f"base_model.model.{module}.lora_A.weight"] = safetensors_io.Tensor("F32", a)
        out[f"base_model.model.{module}.lora_B.weight"] = safetensors_io.Tensor("F32", b)
        adapter[module] = (a, b, alpha / (np.sqrt(own) if rslora else own))
    safetensors_io.save(os.path.join(directory, "adapter_model.safetensors"), out)
    return adapter


def main():
    parser = check_parser(__doc__)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = os.path.join(scratch, "tiny")
        make_tiny_model(args.beamline, model, args.seed)
        config = beam_numpy.read_config(model)
        tensors = beam_numpy.read_checkpoint(model)
        moe_layer = config["first_k_dense_replace"]
        modules = [f"model.layers.{i}.self_attn.{p}" for i in (0, moe_layer) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        modules += [f"model.layers.0.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
        modules += [f"model.layers.{moe_layer}.mlp.experts.{e}.{p}" for e in range(config["n_routed_experts"])
                    for p in ("gate_proj", "up_proj", "down_proj")]
        rng = np.random.default_rng(args.seed)
        true_rank = 8 // config["num_experts_per_tok"]
        adapters = {"ad": write_adapter(os.path.join(scratch, "ad"), tensors, modules, 8, 16.0, True, rng),
                    "tr": write_adapter(os.path.join(scratch, "tr"), tensors, modules, 8, 16.0, False, rng, true_rank)}
        references = {"tiny": tensors}
        for name, adapter in adapters.items():
            merged = references[name] = dict(tensors)
            for module, (a, b, scale) in adapter.items():
                merged[module + ".weight"] = tensors[module + ".weight"] + scale * (b.astype(np.float64) @ a.astype(np.float64))
        prompt = [int(v) for v in rng.integers(0, config["vocab_size"] - 32, 29)]
        k = 3
        server = Server(args.beamline, model, args.device,
                        ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--lora-modules",
                         f"ad={os.path.join(scratch, 'ad')}", f"tr={os.path.join(scratch, 'tr')}",
                         "--max-num-batched-tokens", "16", "--max-num-seqs", "8"])
        try:
            for name, weights in references.items():
                status, reply = post(server.base, "/v1/completions",
                                     {"model": name, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": k})
                assert status == 200, reply
                reference = log_softmax(beam_numpy.forward(config, weights, prompt))
                check(f"model {name}", reply["choices"][0]["prompt_logprobs"], prompt, reference, k, args.tolerance)
        finally:
            server.stop()
        print(f"LoRA: each adapter's prompt_logprobs equal its merged reference's over {len(prompt) - 1} tokens "
              f"({len(modules)} modules incl. every expert of layer {moe_layer}; rsLoRA at rank 8, and experts at "
              f"true rank {true_rank} scaled by alpha / {true_rank}; tolerance {args.tolerance}); the base model's the "
              "unmerged reference's")


if __name__ == "__main__":
    main()

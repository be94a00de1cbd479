#!/usr/bin/env python3
"""LoRA adapters against the NumPy reference: what `beamline serve --enable-lora` returns for a request naming an
adapter equals beam_numpy.py's model with the adapter merged into its weights (W + scale * B A, float64).

  python3 tools/reference/check_lora.py [--beamline build/apps/beamline/beamline] [--device cpu]

A random tiny checkpoint and a random PEFT adapter (adapter_config.json with use_rslora, adapter_model.safetensors in
F32) on q/k/v/o of two layers, the dense MLP and every expert of one MoE layer (docs/lora.md). Checks prompt_logprobs
(top 3) of the adapter's requests against the merged reference within --tolerance, and the base model's against the
unmerged one in the same server.
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


def write_adapter(directory, tensors, modules, rank, alpha, rng):
    """A PEFT adapter over `modules` of the checkpoint `tensors`; returns {module: (A, B)} and the scale."""
    os.makedirs(directory)
    targets = sorted({module.rsplit(".", 1)[1] for module in modules})
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": True,
                   "target_modules": targets, "bias": "none"}, f)
    out, adapter = {}, {}
    for module in modules:
        rows, cols = tensors[module + ".weight"].shape
        a = (0.3 * rng.standard_normal((rank, cols))).astype(np.float32)
        b = (0.05 * rng.standard_normal((rows, rank))).astype(np.float32)
        out[f"base_model.model.{module}.lora_A.weight"] = safetensors_io.Tensor("F32", a)
        out[f"base_model.model.{module}.lora_B.weight"] = safetensors_io.Tensor("F32", b)
        adapter[module] = (a, b)
    safetensors_io.save(os.path.join(directory, "adapter_model.safetensors"), out)
    return adapter, alpha / np.sqrt(rank)


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
        adapter, scale = write_adapter(os.path.join(scratch, "adapter"), tensors, modules, 8, 16.0, rng)
        merged = dict(tensors)
        for module, (a, b) in adapter.items():
            merged[module + ".weight"] = tensors[module + ".weight"] + scale * (b.astype(np.float64) @ a.astype(np.float64))
        prompt = [int(v) for v in rng.integers(0, config["vocab_size"] - 32, 29)]
        k = 3
        server = Server(args.beamline, model, args.device,
                        ["--enable-lora", "--max-lora-rank", "8", "--lora-modules",
                         f"ad={os.path.join(scratch, 'adapter')}", "--max-num-batched-tokens", "16",
                         "--max-num-seqs", "8"])
        try:
            for name, weights in (("ad", merged), ("tiny", tensors)):
                status, reply = post(server.base, "/v1/completions",
                                     {"model": name, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": k})
                assert status == 200, reply
                reference = log_softmax(beam_numpy.forward(config, weights, prompt))
                check(f"model {name}", reply["choices"][0]["prompt_logprobs"], prompt, reference, k, args.tolerance)
        finally:
            server.stop()
        print(f"LoRA: the adapter's prompt_logprobs equal the merged reference's over {len(prompt) - 1} tokens "
              f"({len(modules)} modules incl. every expert of layer {moe_layer}, rsLoRA, tolerance {args.tolerance}); "
              "the base model's the unmerged reference's")


if __name__ == "__main__":
    main()

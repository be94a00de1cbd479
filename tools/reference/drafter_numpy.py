#!/usr/bin/python3
"""Independent float64 NumPy implementation of the block drafter's forward pass (DRAFTER_SEMANTICS.md, refining
docs/model-format.md §6) on top of beam_numpy's target.

    # the block logits (rows 1..B-1) of one draft at anchor P of a token sequence (needs tokens[0..P])
    /usr/bin/python3 tools/reference/drafter_numpy.py logits --target models/beam-nano \\
        --drafter models/beam-nano-drafter --tokens 4092,1,2,3 --anchor 3 --out block.npy
    # a random drafter checkpoint that fits a target (config.json + model.safetensors, BF16)
    /usr/bin/python3 tools/reference/drafter_numpy.py random --target models/beam-nano --out /tmp/drafter \\
        [--layers 2 --target-layer-ids 1,3,5,7 --block-size 8 --sliding-window 128 --seed 0]

Written from the spec, not from the C++ or PyTorch code, so that they can check each other.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import beam_numpy  # noqa: E402
import safetensors_io  # noqa: E402
from beam_numpy import rms, rope, swiglu  # noqa: E402


def read_drafter_config(drafter_dir, target_config):
    """The drafter's config.json with the defaults of DRAFTER_SEMANTICS.md: residual_scale and rms_norm_eps default
    to the target's, head_dim to hidden_size / num_attention_heads, rope_theta to 10000."""
    path = os.path.join(drafter_dir, "config.json")
    with open(path) as f:
        d = json.load(f)
    if "BeamDrafter" not in d.get("architectures", []):
        raise ValueError(f"{path}: architectures must name BeamDrafter")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "sliding_window", "dflash_config"):
        if key not in d:
            raise ValueError(f"{path}: missing key {key}")
    for key in ("target_layer_ids", "block_size", "mask_token_id"):
        if key not in d["dflash_config"]:
            raise ValueError(f"{path}: missing key dflash_config.{key}")
    d.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
    d.setdefault("rope_theta", 10000.0)
    d.setdefault("residual_scale", target_config["residual_scale"])
    d.setdefault("rms_norm_eps", target_config["rms_norm_eps"])
    if d["hidden_size"] != target_config["hidden_size"]:
        raise ValueError(f"{path}: hidden_size {d['hidden_size']} differs from the target's "
                         f"{target_config['hidden_size']}")
    for layer in d["dflash_config"]["target_layer_ids"]:
        if not 0 <= layer < target_config["num_hidden_layers"]:
            raise ValueError(f"{path}: dflash_config.target_layer_ids: {layer} is not a layer of the target")
    if not 0 <= d["dflash_config"]["mask_token_id"] < target_config["vocab_size"]:
        raise ValueError(f"{path}: dflash_config.mask_token_id is outside the target's vocabulary")
    return d


def context_features(d, dt, hidden):
    """c_t for every position of `hidden` (the target's per-layer residual streams, a list over all its layers)."""
    layer_ids = d["dflash_config"]["target_layer_ids"]
    fused = np.concatenate([hidden[layer] for layer in layer_ids], axis=-1) @ dt["fc.weight"].T
    return rms(fused, dt["hidden_norm.weight"], d["rms_norm_eps"])


def draft_block(d, dt, c, t, context, anchor_token, anchor):
    """The drafter's final-layer hidden rows [B, H] and the block logits rows 1..B-1 [B-1, vocab] of one draft.
    context: c_0..c_{P-1} [P, H] (P = anchor); t: the target's tensors (embed_tokens, norm, lm_head)."""
    eps, s = d["rms_norm_eps"], d["residual_scale"]
    nq, nkv, hd = d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]
    block = d["dflash_config"]["block_size"]
    mask = d["dflash_config"]["mask_token_id"]
    window = d["sliding_window"]
    if context.shape[0] != anchor:
        raise ValueError(f"context has {context.shape[0]} positions for anchor {anchor}")
    embed = t["model.embed_tokens.weight"]
    y = embed[np.array([anchor_token] + [mask] * (block - 1))]
    block_pos = anchor + np.arange(block)
    ctx_pos = np.arange(anchor)
    # context key t is visible to query p = P + i iff p - t < W_d (t <= P - 1 holds for every context row);
    # every block key is visible to every block query (bidirectional inside the block)
    visible = np.concatenate([(block_pos[:, None] - ctx_pos[None, :]) < window, np.ones((block, block), bool)], 1)
    for j in range(d["num_hidden_layers"]):
        p = f"layers.{j}."
        n = rms(y, dt[p + "input_layernorm.weight"], eps)
        q = rope((n @ dt[p + "self_attn.q_proj.weight"].T).reshape(block, nq, hd), block_pos, d["rope_theta"])
        kb = rope((n @ dt[p + "self_attn.k_proj.weight"].T).reshape(block, nkv, hd), block_pos, d["rope_theta"])
        vb = (n @ dt[p + "self_attn.v_proj.weight"].T).reshape(block, nkv, hd)
        kc = rope((context @ dt[p + "self_attn.k_proj.weight"].T).reshape(anchor, nkv, hd), ctx_pos, d["rope_theta"])
        vc = (context @ dt[p + "self_attn.v_proj.weight"].T).reshape(anchor, nkv, hd)
        k, v = np.concatenate([kc, kb], 0), np.concatenate([vc, vb], 0)
        o = np.empty((block, nq, hd))
        for head in range(nq):
            kv = head // (nq // nkv)
            scores = np.where(visible, (q[:, head, :] @ k[:, kv, :].T) / math.sqrt(hd), -np.inf)
            scores = scores - scores.max(axis=1, keepdims=True)
            probs = np.exp(scores)
            o[:, head, :] = (probs / probs.sum(axis=1, keepdims=True)) @ v[:, kv, :]
        attn = o.reshape(block, nq * hd) @ dt[p + "self_attn.o_proj.weight"].T
        y = y + s * rms(attn, dt[p + "post_attention_layernorm.weight"], eps)
        h = rms(y, dt[p + "pre_feedforward_layernorm.weight"], eps)
        m = swiglu(h, dt[p + "mlp.gate_proj.weight"], dt[p + "mlp.up_proj.weight"], dt[p + "mlp.down_proj.weight"])
        y = y + s * rms(m, dt[p + "post_feedforward_layernorm.weight"], eps)
    head = t["model.embed_tokens.weight"] if c["tie_word_embeddings"] else t["lm_head.weight"]
    logits = rms(y[1:], t["model.norm.weight"], c["rms_norm_eps"]) @ head.T
    cap = c["final_logit_softcapping"]
    return y, cap * np.tanh(logits / cap)


def block_logits(target_dir, drafter_dir, tokens, anchor):
    """Float64 logits [B-1, vocab] of the draft at anchor P: row i-1 predicts tokens[P+i]. Needs tokens[0..P]; the
    target runs over tokens[0..P-1] (x_P has not been through the target yet)."""
    c = beam_numpy.read_config(target_dir)
    t = beam_numpy.read_checkpoint(target_dir)
    d = read_drafter_config(drafter_dir, c)
    dt = beam_numpy.read_checkpoint(drafter_dir)
    return block_logits_loaded(c, t, d, dt, tokens, anchor)


def block_logits_loaded(c, t, d, dt, tokens, anchor):
    if not 0 <= anchor < len(tokens):
        raise ValueError(f"anchor {anchor} is not a position of the {len(tokens)} tokens")
    if anchor == 0:
        context = np.zeros((0, c["hidden_size"]))
    else:
        hidden = []
        beam_numpy.forward(c, t, tokens[:anchor], hidden)
        context = context_features(d, dt, hidden)
    return draft_block(d, dt, c, t, context, tokens[anchor], anchor)[1]


def drafter_tensor_shapes(d):
    """name -> shape in file order, as src/checkpoint/drafter_checkpoint.cpp expects them."""
    h, f = d["hidden_size"], d["intermediate_size"]
    qw, kvw = d["num_attention_heads"] * d["head_dim"], d["num_key_value_heads"] * d["head_dim"]
    shapes = {"fc.weight": (h, len(d["dflash_config"]["target_layer_ids"]) * h), "hidden_norm.weight": (h,)}
    for j in range(d["num_hidden_layers"]):
        p = f"layers.{j}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (qw, h),
                       p + "self_attn.k_proj.weight": (kvw, h), p + "self_attn.v_proj.weight": (kvw, h),
                       p + "self_attn.o_proj.weight": (h, qw), p + "post_attention_layernorm.weight": (h,),
                       p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    return shapes


def drafter_config(target_config, layers=2, target_layer_ids=(1, 3, 5, 7), block_size=8, mask_token_id=None,
                   sliding_window=128, intermediate_size=None, heads=None, kv_heads=None, head_dim=None):
    """A drafter config.json dict for a target: hidden size and (by default) heads as the target's. The mask token
    defaults to the target's pad token (<|endoftext|> for beam-nano), which a rendered conversation never holds."""
    mask = target_config.get("pad_token_id") if mask_token_id is None else mask_token_id
    if mask is None:
        raise ValueError("the target has no pad_token_id: give mask_token_id")
    return {
        "architectures": ["BeamDrafter"],
        "model_type": "beam_drafter",
        "hidden_size": target_config["hidden_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": heads or target_config["num_attention_heads"],
        "num_key_value_heads": kv_heads or target_config["num_key_value_heads"],
        "head_dim": head_dim or target_config["head_dim"],
        "intermediate_size": intermediate_size or 2 * target_config["intermediate_size"],
        "sliding_window": sliding_window,
        "rope_theta": target_config.get("rope_theta", 10000.0),
        "dflash_config": {"target_layer_ids": list(target_layer_ids), "block_size": block_size,
                          "mask_token_id": int(mask)},
        "torch_dtype": "bfloat16",
    }


def write_random_drafter(target_dir, out_dir, seed=0, **config_args):
    """A random drafter that fits the target (BF16 tensors; norms near 1 so that they are exercised)."""
    c = beam_numpy.read_config(target_dir)
    d = drafter_config(c, **config_args)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in drafter_tensor_shapes(d).items():
        if len(shape) == 1:
            values = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            values = rng.standard_normal(shape) / math.sqrt(shape[1])
        tensors[name] = safetensors_io.Tensor("BF16", safetensors_io.float32_to_bf16_bits(values.astype(np.float32)))
    os.makedirs(out_dir, exist_ok=True)
    safetensors_io.save(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(d, f, indent=2)
        f.write("\n")
    return d


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    logits = sub.add_parser("logits", help="block logits rows 1..B-1 of one draft")
    logits.add_argument("--target", required=True)
    logits.add_argument("--drafter", required=True)
    logits.add_argument("--tokens", required=True, help="comma-separated token ids x_0..x_P (later ones ignored)")
    logits.add_argument("--anchor", type=int, required=True, help="P: the position of the anchor token")
    logits.add_argument("--out", required=True, help="output .npy (float64 [block_size - 1, vocab])")
    rand = sub.add_parser("random", help="write a random drafter checkpoint for a target")
    rand.add_argument("--target", required=True)
    rand.add_argument("--out", required=True)
    rand.add_argument("--layers", type=int, default=2)
    rand.add_argument("--target-layer-ids", default="1,3,5,7")
    rand.add_argument("--block-size", type=int, default=8)
    rand.add_argument("--sliding-window", type=int, default=128)
    rand.add_argument("--mask-token-id", type=int)
    rand.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "logits":
        tokens = [int(v) for v in args.tokens.split(",") if v.strip()]
        np.save(args.out, block_logits(args.target, args.drafter, tokens, args.anchor))
    else:
        write_random_drafter(args.target, args.out, args.seed, layers=args.layers,
                             target_layer_ids=[int(v) for v in args.target_layer_ids.split(",")],
                             block_size=args.block_size, sliding_window=args.sliding_window,
                             mask_token_id=args.mask_token_id)


if __name__ == "__main__":
    main()

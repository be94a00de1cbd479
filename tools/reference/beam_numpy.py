#!/usr/bin/python3
"""Independent float64 NumPy implementation of the Beam forward pass (docs/model-format.md sections 1-4).

Written from the spec, not from the C++ code, so that the two can check each other. Reads a checkpoint
directory (config.json + model.safetensors or sharded with model.safetensors.index.json) and writes the
soft-capped logits of every position of a token sequence, computed in float64 over the whole sequence
(no KV cache). Self-contained: its own safetensors reader and config defaults.

    /usr/bin/python3 tools/reference/beam_numpy.py --model DIR --tokens 5,17,300 --out logits.npy
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


# ---- safetensors ---------------------------------------------------------------------------------

def _decode(raw, dtype, shape, name):
    if dtype == "F32":
        values = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    elif dtype == "F16":
        values = np.frombuffer(raw, dtype="<f2").astype(np.float64)
    elif dtype == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        values = bits.view(np.float32).astype(np.float64)
    else:
        raise ValueError(f"{name}: dtype {dtype} is not supported by the reference")
    count = int(np.prod(shape)) if shape else 1
    if values.size != count:
        raise ValueError(f"{name}: {values.size} values for shape {shape}")
    return values.reshape(shape)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = blob[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: tensor {name} has offsets {begin}..{end} past the data ({len(data)} bytes)")
        tensors[name] = _decode(data[begin:end], info["dtype"], info["shape"], name)
    return tensors


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(model_dir, name)))
    return tensors


# ---- config --------------------------------------------------------------------------------------

def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    layers = c["num_hidden_layers"]
    if "layer_types" not in c:
        every = c.get("global_attention_every", 6)
        c["layer_types"] = ["full_attention" if (i % every == every - 1 or i == layers - 1) else "sliding_attention"
                            for i in range(layers)]
    c.setdefault("residual_scale", 1.0 / math.sqrt(2.0 * layers))
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("final_logit_softcapping", 30.0)
    c.setdefault("ssmax_base", 2048.0)
    c.setdefault("ssmax_exponent", 0.1)
    c.setdefault("norm_topk_prob", True)
    c.setdefault("tie_word_embeddings", False)
    return c


# ---- math ----------------------------------------------------------------------------------------

def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(a):
    return a / (1.0 + np.exp(-a))


def swiglu(h, gate, up, down):
    return (silu(h @ gate.T) * (h @ up.T)) @ down.T


def rope(x, positions, theta):
    """x [T, heads, D]; NeoX rotate-half: pairs (j, j + D/2), angle p * theta^(-2j/D)."""
    d = x.shape[-1]
    half = d // 2
    j = np.arange(half, dtype=np.float64)
    angle = positions[:, None].astype(np.float64) * theta ** (-2.0 * j / d)   # [T, half]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def top_indices(values, count):
    """Indices of the `count` largest values, largest first; ties go to the lower index."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return order[:count]


def route(h, gate_w, bias, c):
    """noaux_tc per token, in float32 as the spec asks (hidden state and weights upcast/rounded to float32)."""
    h32 = h.astype(np.float32)
    w32 = gate_w.astype(np.float32)
    b32 = bias.astype(np.float32)
    experts = w32.shape[0]
    n_group, topk_group, top_k = c["n_group"], c["topk_group"], c["num_experts_per_tok"]
    group_size = experts // n_group
    selections = []
    for t in range(h32.shape[0]):
        logits = (w32.astype(np.float64) @ h32[t].astype(np.float64)).astype(np.float32)
        score = (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
        choice = (score + b32).astype(np.float32)
        group_scores = []
        for g in range(n_group):
            members = [float(v) for v in choice[g * group_size:(g + 1) * group_size]]
            best = top_indices(members, min(2, group_size))
            group_scores.append(sum(members[i] for i in best))
        kept = set(top_indices(group_scores, topk_group))
        masked = [float(choice[e]) if e // group_size in kept else -math.inf for e in range(experts)]
        sel = top_indices(masked, top_k)
        w = np.array([float(score[e]) for e in sel], dtype=np.float64)
        if c["norm_topk_prob"]:
            w = w / w.sum()
        w = w * c["routed_scaling_factor"]
        selections.append((sel, w))
    return selections


def forward(c, t, tokens, hidden=None, routing=None):
    """Logits [len(tokens), vocab] in float64. `hidden`, if a list, receives the residual stream after each layer
    ([len(tokens), hidden_size] per layer, before the final norm): the block drafter's input features. `routing`, if a
    list, receives each MoE layer's expert ids ([len(tokens), top_k] in order of selection, layer after layer): routing
    replay's reference."""
    eps = c["rms_norm_eps"]
    s = c["residual_scale"]
    nq, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    window = c["sliding_window"]
    n = len(tokens)
    positions = np.arange(n)
    x = t["model.embed_tokens.weight"][np.array(tokens)]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, t[p + "input_layernorm.weight"], eps)
        q = (h @ t[p + "self_attn.q_proj.weight"].T).reshape(n, nq, d)
        k = (h @ t[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, d)
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, d)
        query_pos, key_pos = positions[:, None], positions[None, :]
        if c["layer_types"][i] == "sliding_attention":
            q, k = rope(q, positions, c["rope_theta"]), rope(k, positions, c["rope_theta"])
            visible = (key_pos <= query_pos) & (query_pos - key_pos < window)
        else:
            q = q * ((1.0 + positions / c["ssmax_base"]) ** c["ssmax_exponent"])[:, None, None]
            visible = key_pos <= query_pos
        o = np.empty((n, nq, d))
        for head in range(nq):
            kv = head // (nq // nkv)
            scores = (q[:, head, :] @ k[:, kv, :].T) / math.sqrt(d)
            scores = np.where(visible, scores, -np.inf)
            scores = scores - scores.max(axis=1, keepdims=True)
            probs = np.exp(scores)
            probs = probs / probs.sum(axis=1, keepdims=True)
            o[:, head, :] = probs @ v[:, kv, :]
        attn = o.reshape(n, nq * d) @ t[p + "self_attn.o_proj.weight"].T
        x = x + s * rms(attn, t[p + "post_attention_layernorm.weight"], eps)
        h = rms(x, t[p + "pre_feedforward_layernorm.weight"], eps)
        if i < c["first_k_dense_replace"]:
            m = swiglu(h, t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"], t[p + "mlp.down_proj.weight"])
        else:
            m = np.zeros_like(h)
            gate, bias = t[p + "mlp.gate.weight"], t[p + "mlp.gate.e_score_correction_bias"]
            selections = route(h, gate, bias, c)
            if routing is not None:
                routing.append(np.array([sel for sel, _ in selections], dtype=np.int64))
            for row, (sel, w) in enumerate(selections):
                for e, weight in zip(sel, w):
                    e_p = f"{p}mlp.experts.{e}."
                    m[row] += weight * swiglu(h[row:row + 1], t[e_p + "gate_proj.weight"], t[e_p + "up_proj.weight"],
                                              t[e_p + "down_proj.weight"])[0]
        x = x + s * rms(m, t[p + "post_feedforward_layernorm.weight"], eps)
        if hidden is not None:
            hidden.append(x.copy())
    head = t["model.embed_tokens.weight"] if c["tie_word_embeddings"] else t["lm_head.weight"]
    logits = rms(x, t["model.norm.weight"], eps) @ head.T
    cap = c["final_logit_softcapping"]
    return cap * np.tanh(logits / cap)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--tokens", required=True, help="comma-separated token ids")
    parser.add_argument("--out", required=True, help="output .npy (float64 [num_tokens, vocab])")
    args = parser.parse_args()
    config = read_config(args.model)
    tokens = [int(v) for v in args.tokens.split(",") if v.strip()]
    if not tokens:
        sys.exit("--tokens: no token ids")
    for index, token in enumerate(tokens):
        if not 0 <= token < config["vocab_size"]:
            sys.exit(f"--tokens: id {token} at index {index} is outside the vocabulary of {config['vocab_size']}")
    np.save(args.out, forward(config, read_checkpoint(args.model), tokens))


if __name__ == "__main__":
    main()

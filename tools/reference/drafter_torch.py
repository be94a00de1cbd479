"""The block drafter (DRAFTER_SEMANTICS.md, refining docs/model-format.md §6) in PyTorch: the model the drafter is
trained with, and a second reference beside drafter_numpy.py.

Module and parameter names are the checkpoint's tensor names, so `state_dict()` keys are the file's keys.

One forward serves one draft (inference, checks) and many drafts per sequence (training): every sequence has A
anchors P_a, each with its block of B query rows at positions P_a .. P_a+B-1; the keys are the sequence's context
features (positions 0..T-1) followed by all A*B block rows, and `draft_visibility` builds the block-sparse mask
(a block sees the context before its anchor within the window, and its own B rows both ways).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402
from beam_torch import RMSNorm, SwiGLU, fill_from_directory, masked_gqa_attention, rope  # noqa: E402


class DrafterConfig:
    """config.json of a drafter with the defaults of DRAFTER_SEMANTICS.md (residual_scale and rms_norm_eps: the
    target's; head_dim: hidden_size / num_attention_heads; rope_theta: 10000)."""

    def __init__(self, data, target_config, source="config.json"):
        self.raw = dict(data)
        if "BeamDrafter" not in data.get("architectures", []):
            raise ValueError(f"{source}: architectures must name BeamDrafter")
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "sliding_window", "dflash_config"):
            if key not in data:
                raise ValueError(f"{source}: missing key {key}")
        self.hidden_size = data["hidden_size"]
        self.num_hidden_layers = data["num_hidden_layers"]
        self.num_attention_heads = data["num_attention_heads"]
        self.num_key_value_heads = data["num_key_value_heads"]
        self.head_dim = data.get("head_dim", self.hidden_size // self.num_attention_heads)
        self.intermediate_size = data["intermediate_size"]
        self.sliding_window = data["sliding_window"]
        self.rope_theta = float(data.get("rope_theta", 10000.0))
        self.residual_scale = float(data.get("residual_scale", target_config.residual_scale))
        self.rms_norm_eps = float(data.get("rms_norm_eps", target_config.rms_norm_eps))
        block = data["dflash_config"]
        self.target_layer_ids = list(block["target_layer_ids"])
        self.block_size = block["block_size"]
        self.mask_token_id = block["mask_token_id"]
        if self.hidden_size != target_config.hidden_size:
            raise ValueError(f"{source}: hidden_size {self.hidden_size} differs from the target's "
                             f"{target_config.hidden_size}")
        if any(not 0 <= layer < target_config.num_hidden_layers for layer in self.target_layer_ids):
            raise ValueError(f"{source}: dflash_config.target_layer_ids {self.target_layer_ids} are not all layers of "
                             f"the target ({target_config.num_hidden_layers})")
        if not 0 <= self.mask_token_id < target_config.vocab_size:
            raise ValueError(f"{source}: dflash_config.mask_token_id {self.mask_token_id} is outside the vocabulary")
        if self.block_size < 2:
            raise ValueError(f"{source}: dflash_config.block_size must be at least 2")


class DraftAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, n, block_pos, context, context_pos, visible):
        """n [N, Q, H] normed block rows; context [N, T, H] features (not normed); visible [N, Q, T+Q]."""
        N, Q, _ = n.shape
        T = context.shape[1]
        theta = self.c.rope_theta
        q = rope(self.q_proj(n).view(N, Q, self.heads, self.head_dim).transpose(1, 2), block_pos, theta)
        kb = rope(self.k_proj(n).view(N, Q, self.kv_heads, self.head_dim).transpose(1, 2), block_pos, theta)
        vb = self.v_proj(n).view(N, Q, self.kv_heads, self.head_dim).transpose(1, 2)
        kc = rope(self.k_proj(context).view(N, T, self.kv_heads, self.head_dim).transpose(1, 2), context_pos, theta)
        vc = self.v_proj(context).view(N, T, self.kv_heads, self.head_dim).transpose(1, 2)
        k = torch.cat([kc.to(kb.dtype), kb], dim=2)
        v = torch.cat([vc.to(vb.dtype), vb], dim=2)
        return self.o_proj(masked_gqa_attention(q, k, v, visible))


class DraftLayer(nn.Module):
    """Named like a dense target layer (sandwich norms, q/k/v/o, gate/up/down)."""

    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)
        self.post_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.residual_scale = c.residual_scale

    def forward(self, y, block_pos, context, context_pos, visible):
        s = self.residual_scale
        a = self.self_attn(self.input_layernorm(y), block_pos, context, context_pos, visible)
        y = y + s * self.post_attention_layernorm(a).float()
        m = self.mlp(self.pre_feedforward_layernorm(y))
        return y + s * self.post_feedforward_layernorm(m).float()


class BeamDrafter(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_hidden_layers))

    def context(self, features):
        """features [N, T, len(target_layer_ids)*H] (the target's hidden states, concatenated) -> c [N, T, H]."""
        return self.hidden_norm(self.fc(features))

    def forward(self, target, block_tokens, block_pos, context, context_pos, visible):
        """Last-layer rows [N, Q, H] (FP32 residual stream). block_tokens [N, Q] (anchors and mask tokens) are
        embedded with the target's table."""
        y = target.model.embed_tokens(block_tokens).float()
        for layer in self.layers:
            y = layer(y, block_pos, context, context_pos, visible)
        return y


def draft_logits(target, rows):
    """The target's final norm, LM head (FP32) and soft-cap on drafter rows [..., H]."""
    h = target.model.norm(rows)
    with torch.autocast(device_type=rows.device.type, enabled=False):
        logits = F.linear(h.float(), target.lm_head.weight.float())
    cap = target.config.final_logit_softcapping
    return cap * torch.tanh(logits / cap)


def target_features(target, tokens, layer_ids, positions=None):
    """The target's residual stream after each layer of layer_ids, concatenated: [N, T, len(layer_ids)*H] (FP32).
    Runs only the layers up to the deepest one asked for."""
    if positions is None:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    x = target.model.embed_tokens(tokens).float()
    wanted = {}
    for index, layer in enumerate(target.model.layers[:max(layer_ids) + 1]):
        x = layer(x, positions)
        if index in layer_ids:
            wanted[index] = x
    return torch.cat([wanted[layer] for layer in layer_ids], dim=-1)


def draft_inputs(tokens, anchors, block_size, mask_token_id):
    """tokens [N, T], anchors [N, A] -> block tokens [N, A*B] ([x_P, M, ..., M] per anchor) and positions [N, A*B]."""
    N, A = anchors.shape
    offsets = torch.arange(block_size, device=tokens.device)
    block_pos = (anchors[:, :, None] + offsets).reshape(N, A * block_size)
    block_tokens = torch.full((N, A, block_size), mask_token_id, dtype=torch.long, device=tokens.device)
    block_tokens[:, :, 0] = tokens.gather(1, anchors)
    return block_tokens.reshape(N, A * block_size), block_pos


def draft_visibility(anchors, block_size, context_len, window):
    """[N, A*B, T + A*B] bool: query row (a, i) at position p = P_a + i sees context key t iff t < P_a and
    p - t < window, and every row of its own block a."""
    N, A = anchors.shape
    device = anchors.device
    offsets = torch.arange(block_size, device=device)
    query_anchor = anchors[:, :, None].expand(N, A, block_size).reshape(N, A * block_size, 1)
    query_pos = (anchors[:, :, None] + offsets).reshape(N, A * block_size, 1)
    t = torch.arange(context_len, device=device)[None, None, :]
    context_visible = (t < query_anchor) & (query_pos - t < window)
    block_of = torch.arange(A, device=device).repeat_interleave(block_size)
    block_visible = (block_of[:, None] == block_of[None, :]).expand(N, A * block_size, A * block_size)
    return torch.cat([context_visible, block_visible], dim=-1)


def draft(target, drafter, tokens, anchors, features=None):
    """Block logits [N, A, B-1, V] for anchors [N, A] of sequences tokens [N, T] (right-padded; only positions
    before each anchor are read as context, and tokens at the anchors). Target features are computed if not given."""
    c = drafter.config
    if features is None:
        features = target_features(target, tokens, c.target_layer_ids)
    N, T = tokens.shape
    A, B = anchors.shape[1], c.block_size
    context = drafter.context(features)
    context_pos = torch.arange(T, device=tokens.device).expand(N, T)
    block_tokens, block_pos = draft_inputs(tokens, anchors, B, c.mask_token_id)
    visible = draft_visibility(anchors, B, T, c.sliding_window)
    rows = drafter(target, block_tokens, block_pos, context, context_pos, visible).view(N, A, B, -1)
    return draft_logits(target, rows[:, :, 1:])


# ---------------------------------------------------------------- checkpoint I/O

def init_drafter_weights(drafter, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in drafter.state_dict().items():
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        else:
            std = 1.0 / math.sqrt(tensor.shape[-1])
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                std /= math.sqrt(2.0)
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)


def save_drafter(drafter, directory):
    """config.json + model.safetensors (BF16, tensors in the loader's order: fc, hidden_norm, layers)."""
    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for name, tensor in drafter.state_dict().items():
        bits = tensor.detach().to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)
        tensors[name] = safetensors_io.Tensor("BF16", bits)
    safetensors_io.save(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(drafter.config.raw, f, indent=2)
        f.write("\n")


def load_drafter(directory, target_config, device="cpu"):
    with open(os.path.join(directory, "config.json")) as f:
        config = DrafterConfig(json.load(f), target_config, os.path.join(directory, "config.json"))
    return fill_from_directory(BeamDrafter(config), directory).to(device).eval()

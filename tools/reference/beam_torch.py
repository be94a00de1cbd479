"""Beam in PyTorch, written from docs/model-format.md §4: the model beam-nano is trained with, and a
second reference for the engine's golden values.

Module and parameter names are the checkpoint's tensor names (section 3), so `state_dict()` keys are the
file's keys. Attention takes explicit per-token positions, which serves training (right padding),
batched decoding with a KV cache (left padding: pads carry position -1 and are never attended) and checks.

Routed experts are evaluated for every token and weighted by a routing matrix that is zero outside each
token's selected experts: the same sum as evaluating only the selected experts, without data-dependent
shapes (a tiny model is launch-bound, not FLOP-bound).
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
from beam_config import BeamConfig  # noqa: E402


def rms_norm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight, computed in FP32, returned in x's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def rope_tables(positions, theta, head_dim):
    """cos, sin [B, 1, T, D/2] of positions [B, T] (angles in float64, then float32)."""
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float64) * 2.0 / head_dim)
    angles = (positions.double().unsqueeze(-1) * inv_freq).float()            # [B, T, D/2]
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def apply_rope(x, cos, sin):
    """NeoX rotate-half over the full head dim, in FP32, returned in x's dtype."""
    half = x.shape[-1] // 2
    x32 = x.float()
    x1, x2 = x32[..., :half], x32[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rope(x, positions, theta):
    """NeoX rotate-half over the full head dim. x [B, heads, T, D], positions [B, T]."""
    return apply_rope(x, *rope_tables(positions, theta, x.shape[-1]))


def masked_gqa_attention(q, k, v, visible):
    """softmax(q kᵀ / sqrt(D)) v per head over the keys `visible` [B, Tq, Tk] allows, query head h reading kv head
    h // (Nq / Nkv); q [B, Nq, Tq, D], k and v [B, Nkv, Tk, D]; returns [B, Tq, Nq * D]."""
    B, heads, T, head_dim = q.shape
    group = heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(head_dim)
    scores = scores.masked_fill(~visible[:, None, :, :], float("-inf"))
    o = scores.softmax(-1).to(v.dtype) @ v
    return o.transpose(1, 2).reshape(B, T, heads * head_dim)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.sliding = c.is_sliding(layer)
        self.config = c
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def project(self, h):
        """h [B, T, H] -> q [B, Nq, T, D], k and v [B, Nkv, T, D]."""
        B, T, _ = h.shape
        q = self.q_proj(h).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def forward(self, h, positions, cache=None):
        """h [B, T, H]; positions [B, T] (-1 for pads). cache: None or a dict {k, v, pos} this call extends."""
        B, T, _ = h.shape
        c = self.config
        q, k, v = self.project(h)
        if self.sliding:
            q, k = rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta)
        else:
            scale = (1.0 + positions.clamp(min=0).float() / c.ssmax_base) ** c.ssmax_exponent  # SSMax
            q = (q.float() * scale[:, None, :, None]).to(q.dtype)
        key_positions = positions
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
                key_positions = torch.cat([cache["pos"], positions], dim=1)
            cache["k"], cache["v"], cache["pos"] = k, v, key_positions
        qp, kp = positions[:, :, None], key_positions[:, None, :]                # [B, T, 1], [B, 1, Tk]
        visible = (kp <= qp) & (kp >= 0)
        if self.sliding:
            visible &= (qp - kp) < c.sliding_window
        # a pad query (position -1) sees only itself, so no softmax row is empty (no NaN into pad K/V)
        self_index = torch.arange(T, device=h.device) + (kp.shape[-1] - T)
        visible |= (qp < 0) & (torch.arange(kp.shape[-1], device=h.device)[None, None, :] == self_index[None, :, None])
        return self.o_proj(masked_gqa_attention(q, k, v, visible))


class SwiGLU(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Router(nn.Module):
    """noaux_tc group-limited sigmoid router, FP32 end to end.

    Routing replay (R3): with `replay` set to an int tensor [N, top_k] of expert ids (e.g. the routing a rollout engine
    returned), the next forward uses those experts instead of choosing its own, weighted by its own scores.
    `last_selected` holds the [N, top_k] ids the last forward used, in order of selection."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts, dtype=torch.float32))
        self.replay = None
        self.last_selected = None

    def forward(self, h):
        """h [N, H] -> (routing weights [N, E], zero outside the selected experts; selected mask [N, E])."""
        c = self.config
        E, G = c.n_routed_experts, c.n_group
        with torch.autocast(device_type=h.device.type, enabled=False):
            score = torch.sigmoid(h.float() @ self.weight.float().t())
            if self.replay is not None:
                selected = self.replay.to(device=h.device, dtype=torch.long)
            else:
                choice = score + self.e_score_correction_bias                   # bias chooses, never weighs
                per_group = choice.detach().view(-1, G, E // G)
                group_score = per_group.topk(min(2, E // G), dim=-1).values.sum(-1)  # [N, G]
                # stable descending sort: among equal values the lower index comes first
                kept_groups = torch.sort(group_score, dim=-1, descending=True, stable=True).indices[:, :c.topk_group]
                group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept_groups, True)
                expert_mask = group_mask.repeat_interleave(E // G, dim=1)
                masked = choice.detach().masked_fill(~expert_mask, float("-inf"))
                selected = torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :c.num_experts_per_tok]
            self.last_selected = selected
            weights = score.gather(1, selected)
            if c.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdim=True)
            weights = weights * c.routed_scaling_factor
            dense = torch.zeros_like(score).scatter(1, selected, weights)
            chosen = torch.zeros_like(score, dtype=torch.bool).scatter_(1, selected, True)
        return dense, chosen


class MoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = Router(config)
        self.experts = nn.ModuleList(SwiGLU(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.last_load = None   # tokens routed to each expert in the last forward (for the bias update)

    def forward(self, h, valid=None):
        B, T, H = h.shape
        flat = h.reshape(B * T, H)
        routing, chosen = self.gate(flat)
        if valid is not None:
            self.last_load = (chosen & valid.reshape(-1, 1)).sum(0)
        gate_w = torch.stack([e.gate_proj.weight for e in self.experts])          # [E, I, H]
        up_w = torch.stack([e.up_proj.weight for e in self.experts])
        down_w = torch.stack([e.down_proj.weight for e in self.experts])          # [E, H, I]
        a = torch.einsum("nh,eih->eni", flat, gate_w)
        b = torch.einsum("nh,eih->eni", flat, up_w)
        y = torch.einsum("eni,ehi->enh", F.silu(a) * b, down_w)                    # [E, N, H]
        out = (y.float() * routing.t().unsqueeze(-1)).sum(0)                     # FP32 weighted sum
        return out.to(h.dtype).view(B, T, H)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, layer)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MoE(c) if c.is_moe(layer) else SwiGLU(c.hidden_size, c.intermediate_size)
        self.post_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.residual_scale = c.residual_scale

    def forward(self, x, positions, cache=None, valid=None):
        s = self.residual_scale
        a = self.self_attn(self.input_layernorm(x), positions, cache)
        x = x + s * self.post_attention_layernorm(a).float()
        h = self.pre_feedforward_layernorm(x)
        m = self.mlp(h, valid) if isinstance(self.mlp, MoE) else self.mlp(h)
        return x + s * self.post_feedforward_layernorm(m).float()


class BeamBody(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class BeamForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = BeamBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, tokens, positions=None, caches=None, valid=None):
        """tokens [B, T] -> logits [B, T, V] (FP32). positions default to 0..T-1. caches: a list (one dict
        per layer) to decode incrementally. valid [B, T] bool marks real tokens for the router's load count."""
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.model.embed_tokens(tokens).float()                               # residual stream in FP32
        for index, layer in enumerate(self.model.layers):
            x = layer(x, positions, None if caches is None else caches[index], valid)
        h = self.model.norm(x)
        with torch.autocast(device_type=x.device.type, enabled=False):                # LM head in FP32
            logits = F.linear(h.float(), self.lm_head.weight.float())
        cap = self.config.final_logit_softcapping
        return cap * torch.tanh(logits / cap)

    def moe_layers(self):
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, MoE)]


# ---------------------------------------------------------------- checkpoint I/O

ROUTER_SUFFIXES = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")


def init_weights(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in model.state_dict().items():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif name.endswith("e_score_correction_bias"):
            tensor.zero_()
        elif name == "model.embed_tokens.weight":
            tensor.copy_(torch.randn(tensor.shape, generator=generator))
        else:
            fan_in = tensor.shape[-1]
            std = 1.0 / math.sqrt(fan_in)
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                std /= math.sqrt(2.0)
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)


def randomize_for_checks(model, seed):
    """Norm weights 1 + 0.3 N(0, 1) and router biases 0.05 N(0, 1) (init_weights makes them 1 and 0), so that every
    term of the math matters in a comparison."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("norm.weight"):
                tensor.copy_(1.0 + 0.3 * torch.randn(tensor.shape, generator=generator))
            elif name.endswith("e_score_correction_bias"):
                tensor.copy_(0.05 * torch.randn(tensor.shape, generator=generator))


def to_numpy_tensor(name, tensor):
    if name.endswith(ROUTER_SUFFIXES):
        return safetensors_io.Tensor("F32", tensor.detach().float().cpu().numpy())
    bits = tensor.detach().to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)
    return safetensors_io.Tensor("BF16", bits)


def save_checkpoint(model, directory, extra_files=None):
    """config.json + model.safetensors (BF16; router tensors F32) + any extra JSON files {name: obj}."""
    os.makedirs(directory, exist_ok=True)
    state = model.state_dict()
    names = sorted(state, key=lambda n: (not n.endswith(ROUTER_SUFFIXES), n))
    tensors = {name: to_numpy_tensor(name, state[name]) for name in names}
    safetensors_io.save(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(model.config.raw, f, indent=2)
        f.write("\n")
    for filename, obj in (extra_files or {}).items():
        with open(os.path.join(directory, filename), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")


def fill_from_directory(module, directory):
    """Copies a checkpoint directory's tensors into `module`'s parameters (FP32; BF16 files widen exactly), refusing
    a missing, misshapen or foreign tensor by name."""
    stored = safetensors_io.load_checkpoint_tensors(directory)
    state = module.state_dict()
    for name, target in state.items():
        if name not in stored:
            raise ValueError(f"{directory}: tensor {name} missing, expected shape {list(target.shape)}")
        array = stored[name].to_float32()
        if list(array.shape) != list(target.shape):
            raise ValueError(f"{directory}: tensor {name} has shape {list(array.shape)}, expected {list(target.shape)}")
        target.copy_(torch.from_numpy(np.array(array)))
    extra = set(stored) - set(state)
    if extra:
        raise ValueError(f"{directory}: unexpected tensors {sorted(extra)[:5]}")
    return module


def load_checkpoint(directory, device="cpu"):
    """FP32 parameters; run under autocast for BF16 speed."""
    config = BeamConfig.load(os.path.join(directory, "config.json"))
    return fill_from_directory(BeamForCausalLM(config), directory).to(device).eval()


# ---------------------------------------------------------------- greedy decoding

@torch.no_grad()
def greedy_generate(model, prompts, stop_ids, max_new_tokens, device):
    """prompts: list of id lists. Left-pads into one batch, decodes with a KV cache, stops a row at any of
    stop_ids (included in its output). Returns the generated id lists."""
    B = len(prompts)
    longest = max(len(p) for p in prompts)
    tokens = torch.zeros(B, longest, dtype=torch.long)
    positions = torch.full((B, longest), -1, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        tokens[row, longest - len(prompt):] = torch.tensor(prompt)
        positions[row, longest - len(prompt):] = torch.arange(len(prompt))
    tokens, positions = tokens.to(device), positions.to(device)
    caches = [{} for _ in model.model.layers]
    logits = model(tokens, positions, caches)
    next_pos = positions[:, -1:] + 1
    outputs = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    stop = torch.tensor(sorted(stop_ids), device=device)
    for _ in range(max_new_tokens):
        next_token = logits[:, -1].argmax(-1)
        for row, token in enumerate(next_token.tolist()):
            if not done[row]:
                outputs[row].append(token)
        done |= torch.isin(next_token, stop)
        if bool(done.all()):
            break
        logits = model(next_token[:, None], next_pos, caches)
        next_pos = next_pos + 1
    return outputs

"""The training loss of a beam_torch.BeamForCausalLM, computed fast: the same parameters and the same math as
the reference's forward (docs/model-format.md §4), rearranged for a GPU so that a step has no host sync and no
data-dependent shape (the CPU can queue whole steps ahead, and torch.compile sees one graph per layer kind).

  loss = fast_loss(model, tokens, loss_mask, valid)            # == train.py's reference loss within float32 rounding
  loss = fast_loss(model, tokens, loss_mask, valid, targets)   # targets = target_positions(loss_mask) (host side)

tokens [B, T] are right-padded conversations (positions 0..T-1, `valid` marks real tokens); the loss is the mean
cross-entropy of the tokens loss_mask[:, 1:] marks. What differs from the reference, and why the result is the same:
- attention goes through torch.nn.functional.scaled_dot_product_attention: causal (flash) on the full layers and
  on sliding layers no longer than the window; longer sliding layers are cut into window-sized query blocks, each
  reading its own and the previous block's keys under a fixed [W, 2W] band mask (the first block: causal), so a
  query reads 2W keys instead of T; SSMax scales q before it, as the reference does; RoPE's cos/sin are computed
  once per forward, from the same float64 angles;
- each MoE layer routes every token with the reference's router (pads too, as the reference does; the expert loads
  count real tokens only) and computes its experts as one wide SwiGLU: the experts' gate/up weights side by side
  ([E*I, H]), the product silu(gate) * up scaled by each token's FP32 routing weight (zero outside its top-k), then
  the experts' down weights side by side: sum_e r_e * down_e(act_e), the reference's weighted sum, as three large
  GEMMs without a gather, a sort or a count read back to the host;
- the LM head runs only on the positions the loss reads (chosen on the host, at collation);
- a norm that feeds only linear layers is rounded to the autocast dtype once (the value autocast's linear would cast
  it to), rather than once per projection.
With use_compile(True) each decoder layer and the head are compiled by torch.compile (dynamic shapes: one graph per
layer kind whatever the batch's length); train.py checks the compiled loss and falls back to eager on any failure.
tools/train/test_beam_fast.py checks loss and every gradient against the reference on the CPU.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference"))
from beam_torch import MoE, apply_rope, rms_norm, rope_tables  # noqa: E402

_compiled = {}


def use_compile(enabled, mode=None):
    """Compiles the decoder layer and the head (dynamic shapes) or returns to eager; raises what torch.compile
    raises. `mode` is torch.compile's (None: its default)."""
    _compiled.clear()
    if enabled:
        import torch._dynamo   # noqa: F401 (torch < 2.0 has none: the caller's fallback)
        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):     # layer kinds x length branches, with room
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 64))
        _compiled["layer"] = torch.compile(_layer, dynamic=True, mode=mode)
        _compiled["head"] = torch.compile(_head_loss, dynamic=True, mode=mode)


def compiled():
    return bool(_compiled)


def _op(name):
    return _compiled.get(name, _EAGER[name])


def sdpa(q, k, v, mask=None, causal=False):
    """softmax(q kᵀ / sqrt(D) + mask) v; q, k, v [..., T, D]; mask a bool [Tq, Tk] of visible keys."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    # torch < 2.0 (the CPU smoke test): the same definition
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def band_mask(window, device):
    """[W, 2W] bool: query a of a block (absolute position iW + a) sees span key b (absolute (i-1)W + b) when
    a < b <= a + W, i.e. key <= query and query - key < W."""
    a = torch.arange(window, device=device)[:, None]
    b = torch.arange(2 * window, device=device)[None, :]
    return (b > a) & (b <= a + window)


def sliding_sdpa(q, k, v, window):
    """Causal attention within `window` keys (key <= query, query - key < W) for T > W; q, k, v [B, N, T, D]."""
    B, N, T, D = q.shape
    blocks = (T + window - 1) // window
    q, k, v = (F.pad(t, (0, 0, 0, blocks * window - T)) for t in (q, k, v))   # zero keys past T: every query's future
    first = sdpa(q[:, :, :window], k[:, :, :window], v[:, :, :window], causal=True)

    def spans(t):   # [B, N, blocks - 1, 2W, D]: each block after the first with the block before it
        t = t.reshape(B, N, blocks, window, D)
        return torch.cat([t[:, :, :-1], t[:, :, 1:]], dim=3).reshape(B, N * (blocks - 1), 2 * window, D)

    rest = sdpa(q[:, :, window:].reshape(B, N * (blocks - 1), window, D), spans(k), spans(v),
                mask=band_mask(window, q.device))
    return torch.cat([first, rest.reshape(B, N, (blocks - 1) * window, D)], dim=2)[:, :, :T]


def _attention(attn, h, cos, sin, ssmax):
    B, T, _ = h.shape
    window = attn.config.sliding_window
    q, k, v = attn.project(h)
    if attn.sliding:
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    else:
        q = (q.float() * ssmax).to(q.dtype)
    group = attn.heads // attn.kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if attn.sliding and T > window:
        o = sliding_sdpa(q, k, v, window)
    else:                                    # causal (a window at least T long hides nothing more)
        o = sdpa(q, k, v, causal=True)
    return attn.o_proj(o.transpose(1, 2).reshape(B, T, attn.heads * attn.head_dim))


def _swiglu(mlp, h):
    return mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))


def _moe(moe, h, valid, dtype):
    """Every expert as one wide SwiGLU whose activations are scaled by the (sparse) FP32 routing weights; returns
    the output [B, T, H] (h's dtype) and the real tokens routed to each expert."""
    B, T, H = h.shape
    x = h.reshape(B * T, H)
    routing, chosen = moe.gate(x)                                              # FP32 [N, E], zero off the top-k
    load = (chosen & valid.reshape(-1, 1)).sum(0)
    experts = moe.experts
    gate_up = torch.cat([e.gate_proj.weight for e in experts] + [e.up_proj.weight for e in experts])  # [2*E*I, H]
    down = torch.cat([e.down_proj.weight for e in experts], dim=1)             # [H, E*I]
    a, b = F.linear(x.to(dtype), gate_up).chunk(2, dim=-1)
    E, I = len(experts), experts[0].gate_proj.weight.shape[0]
    act = (F.silu(a) * b).view(B * T, E, I) * routing.unsqueeze(-1)            # FP32 weights, as the reference's sum
    out = F.linear(act.view(B * T, E * I), down)
    return out.to(h.dtype).view(B, T, H), load


def _layer(layer, x, cos, sin, ssmax, valid, dtype):
    """One decoder layer on the FP32 residual stream x [B, T, H]; returns (x, expert loads or None)."""
    s, eps = layer.residual_scale, layer.input_layernorm.eps
    a = _attention(layer.self_attn, rms_norm(x, layer.input_layernorm.weight, eps).to(dtype), cos, sin, ssmax)
    x = x + s * rms_norm(a, layer.post_attention_layernorm.weight, eps).float()
    load = None
    if isinstance(layer.mlp, MoE):     # the router reads the FP32 norm, the experts its autocast rounding
        m, load = _moe(layer.mlp, rms_norm(x, layer.pre_feedforward_layernorm.weight, eps), valid, dtype)
    else:
        m = _swiglu(layer.mlp, rms_norm(x, layer.pre_feedforward_layernorm.weight, eps).to(dtype))
    return x + s * rms_norm(m, layer.post_feedforward_layernorm.weight, eps).float(), load


def _head_loss(x, tokens, targets, norm_weight, eps, lm_weight, cap):
    """Mean cross-entropy of the tokens after the flat positions `targets` of x [B, T, H]; LM head in FP32."""
    B, T, H = x.shape
    h = rms_norm(x.reshape(B * T, H).index_select(0, targets), norm_weight, eps)
    with torch.autocast(device_type=x.device.type, enabled=False):
        logits = F.linear(h.float(), lm_weight.float())
    logits = cap * torch.tanh(logits / cap)
    return F.cross_entropy(logits, tokens.reshape(-1).index_select(0, targets + 1))


_EAGER = {"layer": _layer, "head": _head_loss}


def target_positions(loss_mask):
    """Flat positions b*T + t whose next token loss_mask marks (t < T-1), in row-major order: the LM head's rows.
    Computing it on the host (collation) keeps the device step free of a nonzero's sync."""
    T = loss_mask.shape[1]
    rows, cols = loss_mask[:, 1:].nonzero(as_tuple=True)
    return rows * T + cols


def _autocast_dtype(device_type):
    """The dtype autocast gives linear layers here, float32 outside autocast."""
    if hasattr(torch, "get_autocast_dtype"):     # torch >= 2.4
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else torch.float32
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else torch.float32
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else torch.float32


def fast_loss(model, tokens, loss_mask, valid, targets=None):
    """Mean cross-entropy over the targets loss_mask[:, 1:] marks (`targets`: target_positions(loss_mask), given
    to avoid a sync); sets each MoE layer's last_load (real tokens)."""
    c = model.config
    device = tokens.device
    if targets is None:
        targets = target_positions(loss_mask)
    positions = torch.arange(tokens.shape[1], device=device)
    cos, sin = rope_tables(positions[None], c.rope_theta, c.head_dim)
    ssmax = ((1.0 + positions.float() / c.ssmax_base) ** c.ssmax_exponent)[None, None, :, None]
    dtype = _autocast_dtype(device.type)
    x = model.model.embed_tokens(tokens).float()
    for layer in model.model.layers:
        x, load = _op("layer")(layer, x, cos, sin, ssmax, valid, dtype)
        if load is not None:
            layer.mlp.last_load = load
    norm = model.model.norm
    return _op("head")(x, tokens, targets, norm.weight, norm.eps, model.lm_head.weight, c.final_logit_softcapping)


def eager_loss(model, tokens, loss_mask, valid, targets=None):
    """fast_loss without torch.compile, whatever use_compile set (what the compiled loss is checked against)."""
    saved = dict(_compiled)
    _compiled.clear()
    try:
        return fast_loss(model, tokens, loss_mask, valid, targets)
    finally:
        _compiled.update(saved)


def reference_loss(model, tokens, loss_mask, valid, targets=None):
    """train.py's loss through beam_torch's own forward (`targets` unused: the reference selects them itself)."""
    logits = model(tokens, valid=valid)
    target_mask = loss_mask[:, 1:]
    return F.cross_entropy(logits[:, :-1][target_mask].float(), tokens[:, 1:][target_mask])


def _loss_and_grads(model, fn, tokens, loss_mask, valid):
    model.zero_grad(set_to_none=True)
    loss = fn(model, tokens, loss_mask, valid)
    loss.backward()
    loads = [m.last_load.clone() for m in model.moe_layers()]
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, loads


def check_against_reference(model, tokens, loss_mask, valid, tolerance=1e-4, log=print, reference=None,
                            exact_routing=True, label="fast path vs reference"):
    """Compares fast_loss with `reference` (default: the reference loss) on loss, gradients and expert loads; returns
    True when they agree within `tolerance` (relative). In float32, outside autocast, against the reference: every
    gradient within tolerance and the same loads. Under autocast (exact_routing=False) a near-tie may route a token
    to another expert, which moves that expert's gradient by one token's share: the loads may differ and the gradient
    is compared as a whole (all parameters' difference over all parameters' norm)."""
    ref_loss, ref_grads, ref_loads = _loss_and_grads(model, reference or reference_loss, tokens, loss_mask, valid)
    fast, fast_grads, fast_loads = _loss_and_grads(model, fast_loss, tokens, loss_mask, valid)
    model.zero_grad(set_to_none=True)
    ok = abs(fast - ref_loss) <= tolerance * abs(ref_loss) and set(fast_grads) == set(ref_grads)
    for name in set(ref_grads) - set(fast_grads):
        log(f"fast path: no gradient for {name}")
    worst, worst_name, diff2, norm2 = 0.0, "", 0.0, 0.0
    for name, g in ref_grads.items():
        if name not in fast_grads:
            continue
        d, n = float((fast_grads[name].float() - g.float()).norm()), float(g.float().norm())
        diff2, norm2 = diff2 + d * d, norm2 + n * n
        if d / max(n, 1e-30) > worst:
            worst, worst_name = d / max(n, 1e-30), name
    whole = math.sqrt(diff2 / max(norm2, 1e-30))
    moved = sum(int((a - b).abs().sum()) for a, b in zip(ref_loads, fast_loads)) // 2
    ok = ok and (worst <= tolerance and moved == 0 if exact_routing else whole <= tolerance)
    log(f"{label}: loss {fast:.6f} vs {ref_loss:.6f}, gradient relative difference {whole:.2e} (all), {worst:.2e}"
        f" (worst: {worst_name}), expert loads {'equal' if moved == 0 else f'differ by {moved} token-choices'}:"
        f" {'ok' if ok else 'MISMATCH'}")
    return ok

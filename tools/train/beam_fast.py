"""The training loss of a beam_torch.BeamForCausalLM, computed fast: the same parameters and the same math as
the reference's forward (docs/model-format.md §4), rearranged for a GPU.

  loss = fast_loss(model, tokens, loss_mask, valid)   # == train.py's reference loss within float32 rounding

tokens [B, T] are right-padded conversations (positions 0..T-1, `valid` marks real tokens); the loss is the mean
cross-entropy of the tokens loss_mask[:, 1:] marks. What differs from the reference, and why the result is the same:
- attention goes through torch.nn.functional.scaled_dot_product_attention (flash attention for the causal full
  layers, a boolean causal+window mask for the sliding ones); SSMax scales q before it, as the reference does;
  RoPE's cos/sin are computed once per forward, from the same float64 angles;
- each MoE layer routes only the real tokens (pads sit after them and no real token attends to a pad) with the
  reference's router, then computes each expert on the tokens that chose it (token-expert pairs sorted by
  expert), weighting by the same router weights in FP32;
- the LM head runs only on the positions the loss reads;
- a norm that feeds only linear layers is rounded to the autocast dtype in its own kernel (the value autocast's
  linear would cast it to), once, rather than once per projection.
Pure elementwise pieces (RMSNorm and the residual add, RoPE, SwiGLU's gate) are compiled with torch.compile
when `use_compile(True)` succeeds; train.py probes that once and falls back to eager on any failure.
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


def _rms_cast(x, weight, eps, dtype):
    """rms_norm(x) rounded to `dtype` in the same kernel: what autocast's linear would cast it to anyway."""
    return rms_norm(x, weight, eps).to(dtype)


def _residual(x, a, weight, eps, scale):
    """x + scale * rms_norm(a): the sandwich norm's residual add (FP32 stream)."""
    return x + scale * rms_norm(a, weight, eps).float()


def _swiglu_gate(a, b):
    return F.silu(a) * b


_EAGER = {"rms": rms_norm, "rms_cast": _rms_cast, "residual": _residual, "rope": apply_rope,
          "swiglu_gate": _swiglu_gate}


def use_compile(enabled):
    """Compiles the elementwise pieces (dynamic shapes) or returns to eager; raises what torch.compile raises."""
    _compiled.clear()
    if enabled:
        for name, fn in _EAGER.items():
            _compiled[name] = torch.compile(fn, dynamic=True)


def compiled():
    return bool(_compiled)


def _op(name):
    return _compiled.get(name, _EAGER[name])


def sdpa(q, k, v, mask=None, causal=False):
    """softmax(q kᵀ / sqrt(D) + mask) v; q, k, v [B, N, T, D]; mask a bool [T, T] of visible keys."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    # torch < 2.0 (the CPU smoke test): the same definition
    T = q.shape[-2]
    if causal:
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def _attention(attn, h, ctx):
    B, T, _ = h.shape
    c = attn.config
    q, k, v = attn.project(h)
    if attn.sliding:
        q, k = _op("rope")(q, *ctx["rope"]), _op("rope")(k, *ctx["rope"])
    else:
        q = (q.float() * ctx["ssmax"]).to(q.dtype)
    group = attn.heads // attn.kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if attn.sliding and T > c.sliding_window:
        o = sdpa(q, k, v, mask=ctx["window"])
    else:                                    # causal (a window at least T long hides nothing more)
        o = sdpa(q, k, v, causal=True)
    return attn.o_proj(o.transpose(1, 2).reshape(B, T, attn.heads * attn.head_dim))


def _swiglu(mlp, h):
    return mlp.down_proj(_op("swiglu_gate")(mlp.gate_proj(h), mlp.up_proj(h)))


def _moe(moe, h, ctx):
    """Routed experts on the real tokens only, each expert on the tokens that chose it."""
    B, T, H = h.shape
    rows = ctx["real_rows"]
    x = h.reshape(B * T, H).index_select(0, rows)
    dense, chosen = moe.gate(x)
    selected = moe.gate.last_selected                                        # [N, k], reference's order
    k = selected.shape[1]
    moe.last_load = chosen.sum(0)
    weights = dense.gather(1, selected).reshape(-1)                          # FP32
    flat = selected.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = torch.div(order, k, rounding_mode="floor")
    counts = torch.bincount(flat, minlength=len(moe.experts)).tolist()
    xs = x.index_select(0, token).to(ctx["dtype"])                            # one cast for gate and up
    outs = []
    start = 0
    for expert, count in zip(moe.experts, counts):
        if count:
            outs.append(_swiglu(expert, xs[start:start + count]))
        start += count
    y = torch.cat(outs).float() * weights.index_select(0, order).unsqueeze(-1)
    out = torch.zeros(x.shape[0], H, dtype=torch.float32, device=h.device).index_add(0, token, y)
    full = torch.zeros(B * T, H, dtype=h.dtype, device=h.device).index_copy(0, rows, out.to(h.dtype))
    return full.view(B, T, H)


def _autocast_dtype(device_type):
    """The dtype autocast gives linear layers here, float32 outside autocast."""
    if hasattr(torch, "get_autocast_dtype"):     # torch >= 2.4
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else torch.float32
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else torch.float32
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else torch.float32


def _context(model, tokens, valid):
    c = model.config
    T = tokens.shape[1]
    device = tokens.device
    positions = torch.arange(T, device=device)
    window = (positions[None, :] <= positions[:, None]) & (positions[:, None] - positions[None, :] < c.sliding_window)
    ssmax = ((1.0 + positions.float() / c.ssmax_base) ** c.ssmax_exponent)[None, None, :, None]
    return {"rope": rope_tables(positions[None], c.rope_theta, c.head_dim), "window": window, "ssmax": ssmax,
            "real_rows": valid.reshape(-1).nonzero().squeeze(1), "dtype": _autocast_dtype(device.type)}


def fast_loss(model, tokens, loss_mask, valid):
    """Mean cross-entropy over the targets loss_mask[:, 1:] marks; sets each MoE layer's last_load (real tokens)."""
    ctx = _context(model, tokens, valid)
    x = model.model.embed_tokens(tokens).float()
    for layer in model.model.layers:
        s, eps = layer.residual_scale, layer.input_layernorm.eps
        a = _attention(layer.self_attn, _op("rms_cast")(x, layer.input_layernorm.weight, eps, ctx["dtype"]), ctx)
        x = _op("residual")(x, a, layer.post_attention_layernorm.weight, eps, s)
        if isinstance(layer.mlp, MoE):     # the router reads the FP32 norm, the experts its autocast rounding
            m = _moe(layer.mlp, _op("rms")(x, layer.pre_feedforward_layernorm.weight, eps), ctx)
        else:
            m = _swiglu(layer.mlp, _op("rms_cast")(x, layer.pre_feedforward_layernorm.weight, eps, ctx["dtype"]))
        x = _op("residual")(x, m, layer.post_feedforward_layernorm.weight, eps, s)
    target_mask = loss_mask[:, 1:]
    h = _op("rms")(x[:, :-1][target_mask], model.model.norm.weight, model.model.norm.eps)
    with torch.autocast(device_type=tokens.device.type, enabled=False):
        logits = F.linear(h.float(), model.lm_head.weight.float())
    cap = model.config.final_logit_softcapping
    logits = cap * torch.tanh(logits / cap)
    return F.cross_entropy(logits, tokens[:, 1:][target_mask])


def reference_loss(model, tokens, loss_mask, valid):
    """train.py's loss through beam_torch's own forward."""
    logits = model(tokens, valid=valid)
    target_mask = loss_mask[:, 1:]
    return F.cross_entropy(logits[:, :-1][target_mask].float(), tokens[:, 1:][target_mask])


def _loss_and_grads(model, fn, tokens, loss_mask, valid):
    model.zero_grad(set_to_none=True)
    loss = fn(model, tokens, loss_mask, valid)
    loss.backward()
    loads = [m.last_load.clone() for m in model.moe_layers()]
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, loads


def check_against_reference(model, tokens, loss_mask, valid, tolerance=1e-4, log=print):
    """Compares fast_loss with the reference loss (loss, every gradient, expert loads); returns True when
    they agree within `tolerance` (relative). Run it in float32, outside autocast."""
    ref_loss, ref_grads, ref_loads = _loss_and_grads(model, reference_loss, tokens, loss_mask, valid)
    fast, fast_grads, fast_loads = _loss_and_grads(model, fast_loss, tokens, loss_mask, valid)
    model.zero_grad(set_to_none=True)
    ok = abs(fast - ref_loss) <= tolerance * abs(ref_loss)
    worst, worst_name = 0.0, ""
    for name, g in ref_grads.items():
        other = fast_grads.get(name)
        if other is None:
            ok = False
            log(f"fast path: no gradient for {name}")
            continue
        rel = float((other - g).norm() / g.norm().clamp(min=1e-30))
        if rel > worst:
            worst, worst_name = rel, name
    ok = ok and worst <= tolerance and set(fast_grads) == set(ref_grads)
    loads_equal = all(torch.equal(a, b) for a, b in zip(ref_loads, fast_loads))
    ok = ok and loads_equal
    log(f"fast path vs reference: loss {fast:.6f} vs {ref_loss:.6f}, worst gradient relative difference {worst:.2e}"
        f" ({worst_name}), expert loads {'equal' if loads_equal else 'DIFFER'}: {'ok' if ok else 'MISMATCH'}")
    return ok

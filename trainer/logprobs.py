"""Per-token log-probs (and entropies) of the taken tokens, fused with the LM head.

The plain way -- `logits = hidden @ W.T` (N, V), then an fp32 `log_softmax` kept for backward --
holds two (N, V) fp32 tensors: for N = 16k tokens and a 152k vocabulary that is ~20 GB.
`token_logprobs` instead walks the tokens in chunks of `chunk_tokens` inside one autograd Function:
forward keeps only logsumexp, log-prob and entropy per token (N,); backward recomputes each chunk's
logits from the saved hidden states and head weight, so only a few (chunk, V) buffers live at once
and the full logits never exist (the recompute costs one extra head matmul per chunk).

Gradients used in backward, with z the chunk's logits, p = softmax(z), y the taken token:
  d logp_y / dz = onehot(y) - p
  d H / dz      = -p * (log p + H)           (H = -sum p log p, the entropy)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, get_args

import torch
from torch import Tensor

DEFAULT_CHUNK_TOKENS = 2048
HeadImpl = Literal["inplace", "functional", "compiled"]


def _chunk_stats(z_raw: Tensor, t: Tensor, inv_temp: Tensor | float) -> tuple[Tensor, Tensor, Tensor]:
    """Raw logits (n, V) of any dtype, targets (n,) -> (logsumexp, logp of targets, entropy), each (n,),
    at least fp32, for logits z = z_raw * inv_temp (a float, or (n, 1) per row). Functional, so
    torch.compile fuses it into one pass.

    Stable for peaked distributions: with s = z - max z and d = sum of exp(s) over every entry but the
    first maximum, log Z = max z + log1p(d) and H = -sum p log p with log p = s - log1p(d). The direct
    `lse - sum p z` subtracts two numbers of size |z| to get one of size p_rest * |s|, and loses it.
    """
    z = _at_least_fp32(z_raw) * inv_temp  # (n, V)
    top, arg = z.max(dim=-1, keepdim=True)  # (n, 1) x2
    s = z - top  # (n, V), <= 0
    e = torch.exp(s).scatter(1, arg, 0.0)  # (n, V), the first maximum's exp(0) = 1 left out
    log_norm = torch.log1p(e.sum(dim=-1, keepdim=True))  # (n, 1)
    logp_all = s - log_norm  # (n, V)
    p = torch.exp(logp_all)  # (n, V)
    ent = -torch.where(p > 0, p * logp_all, 0.0).sum(dim=-1)  # (n,)
    logp = logp_all.gather(1, t[:, None]).squeeze(1)  # (n,)
    return (top + log_norm).squeeze(1), logp, ent


def _grad_inplace(
    z_raw: Tensor, t: Tensor, lse: Tensor, ent: Tensor, g_lp: Tensor, g_ent: Tensor | None, inv_temp: Tensor | float
) -> Tensor:
    """Gradient of sum(g_lp * logp + g_ent * H) w.r.t. the raw logits (n, V), in z_raw's dtype
    (g_ent None: the entropy is not differentiated).

    Eager and lean: two (n, V) fp32 buffers (log p in place on the logits, p in place into the result).
    """
    logp_all = _at_least_fp32(z_raw).mul(inv_temp).sub_(lse[:, None])  # (n, V) log p
    p = logp_all.exp()  # (n, V)
    if g_ent is None:
        gz = p.mul_(-g_lp[:, None])  # (n, V)
    else:  # coef = g_lp + g_ent (log p + H)
        coef = logp_all.add_(ent[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None])  # (n, V)
        gz = p.mul_(coef).neg_()  # (n, V)
    gz.scatter_add_(1, t[:, None], g_lp[:, None])  # + g_lp * onehot(y)
    return gz.mul_(inv_temp).to(z_raw.dtype)


def _grad_functional(
    z_raw: Tensor, t: Tensor, lse: Tensor, ent: Tensor, g_lp: Tensor, g_ent: Tensor | None, inv_temp: Tensor | float
) -> Tensor:
    """The same gradient as `_grad_inplace`, written functionally for torch.compile (one fused pass)."""
    logp_all = _at_least_fp32(z_raw) * inv_temp - lse[:, None]  # (n, V)
    onehot = torch.arange(z_raw.shape[1], device=z_raw.device)[None, :] == t[:, None]  # (n, V)
    coef = g_lp[:, None] if g_ent is None else g_lp[:, None] + g_ent[:, None] * (logp_all + ent[:, None])
    gz = onehot * g_lp[:, None] - torch.exp(logp_all) * coef  # (n, V)
    return (gz * inv_temp).to(z_raw.dtype)


@functools.cache
def _kernels(impl: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(stats, grad) kernels of an implementation; `compiled` compiles the functional pair once."""
    if impl == "inplace":
        return _chunk_stats, _grad_inplace
    if impl == "functional":
        return _chunk_stats, _grad_functional
    return torch.compile(_chunk_stats, dynamic=True), torch.compile(_grad_functional, dynamic=True)


class _FusedTokenLogprobs(torch.autograd.Function):
    """hidden (B, T, H), weight (V, H), targets (B, T) -> logp (B, T), entropy (B, T), at least fp32."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, inv_temp: Tensor | float, impl: str
    ) -> tuple[Tensor, Tensor]:
        b, t, h = hidden.shape
        flat_h, flat_t = hidden.reshape(b * t, h), targets.reshape(b * t)  # (N, H), (N,)
        stats_dtype = torch.promote_types(hidden.dtype, torch.float32)
        logp = torch.empty(b, t, dtype=stats_dtype, device=hidden.device)  # (B, T)
        ent = torch.empty_like(logp)  # (B, T)
        lse = torch.empty(b * t, dtype=stats_dtype, device=hidden.device)  # (N,)
        lp_flat, ent_flat = logp.view(-1), ent.view(-1)  # (N,) views
        stats = _kernels(impl)[0]
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, b * t, chunk):
                e = min(s + chunk, b * t)
                z_raw = torch.mm(flat_h[s:e], weight.t())  # (n, V) in the compute dtype
                lse[s:e], lp_flat[s:e], ent_flat[s:e] = stats(z_raw, flat_t[s:e], _rows(inv_temp, s, e))
                del z_raw
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.chunk, ctx.inv_temp, ctx.impl = chunk, inv_temp, impl
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if g_logp is None and g_ent is None:
            return None, None, None, None, None, None
        b, t, h = hidden.shape
        flat_h, flat_t, flat_ent = hidden.reshape(b * t, h), targets.reshape(b * t), ent.reshape(b * t)
        g_lp = torch.zeros_like(lse) if g_logp is None else g_logp.reshape(b * t)  # (N,)
        g_en = None if g_ent is None else g_ent.reshape(b * t)  # (N,)
        grad_h = torch.empty_like(flat_h) if need_h else None  # (N, H)
        w_dtype = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=w_dtype, device=weight.device) if need_w else None
        grad = _kernels(ctx.impl)[1]
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, b * t, ctx.chunk):
                e = min(s + ctx.chunk, b * t)
                z_raw = torch.mm(flat_h[s:e], weight.t())  # (n, V) recomputed
                g_en_c = None if g_en is None else g_en[s:e]
                inv = _rows(ctx.inv_temp, s, e)
                gz = grad(z_raw, flat_t[s:e], lse[s:e], flat_ent[s:e], g_lp[s:e], g_en_c, inv)
                del z_raw
                if grad_h is not None:
                    grad_h[s:e] = torch.mm(gz, weight)  # (n, H)
                if grad_w is not None:
                    grad_w.add_(torch.mm(gz.t(), flat_h[s:e]))  # (V, H)
                del gz
        return (
            None if grad_h is None else grad_h.view(b, t, h),
            None if grad_w is None else grad_w.to(weight.dtype),
            None,
            None,
            None,
            None,
        )


def _rows(inv_temp: Tensor | float, s: int, e: int) -> Tensor | float:
    """The inverse temperatures of flat rows s:e: a float as is, a per-row (N, 1) tensor sliced."""
    return inv_temp if isinstance(inv_temp, float) else inv_temp[s:e]


def token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    temperature: float | Tensor = 1.0,
    impl: HeadImpl = "inplace",
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target token and entropy of the same distribution, fused with the LM head.

    hidden (B, T, H), weight (V, H) (the LM head, no bias), targets (B, T) long
    -> (logp (B, T), entropy (B, T)), fp32 (fp64 for fp64 inputs). Logits are `hidden @ weight.T / temperature`;
    temperature is one float or a (B, T) tensor (each position's sampling temperature, e.g. per group).
    Under autocast the matmuls run in the autocast dtype; softmax statistics are always fp32.
    Never materialises more than `chunk_tokens` rows of logits at once (forward or backward).
    impl: `inplace` (eager, fewest buffers), `functional` (eager, the code `compiled` compiles),
    `compiled` (torch.compile fuses each chunk's softmax statistics / gradient into single passes
    over the compute-dtype logits; worth it on GPU).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if isinstance(temperature, Tensor):
        if temperature.shape != targets.shape or not bool((temperature > 0).all()):
            raise ValueError(f"temperature must be > 0 everywhere, shaped like targets {tuple(targets.shape)}")
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        inv_temp: Tensor | float = (1.0 / temperature.to(hidden.device, dtype)).reshape(-1, 1)  # (N, 1)
    elif temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    else:
        inv_temp = 1.0 / float(temperature)
    if impl not in get_args(HeadImpl):
        raise ValueError(f"unknown head impl {impl!r}; valid: {', '.join(get_args(HeadImpl))}")
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
    return _FusedTokenLogprobs.apply(hidden, weight, targets, chunk_tokens, inv_temp, impl)


def _at_least_fp32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def token_logprobs_plain(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """The straightforward version: logits (B, T, V), targets (B, T) -> logp (B, T) fp32.

    Materialises the full fp32 log-softmax (B, T, V); kept as the baseline in tests and bench.
    """
    logp_all = torch.log_softmax(_at_least_fp32(logits) / temperature, dim=-1)  # (B, T, V)
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_plain(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature): logits (B, T, V) -> (B, T) fp32."""
    logp_all = torch.log_softmax(_at_least_fp32(logits) / temperature, dim=-1)  # (B, T, V)
    return -(logp_all.exp() * logp_all).sum(-1)

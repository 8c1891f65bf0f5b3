"""Per-token log-probs (and entropies) of the taken tokens, fused with the LM head.

The plain way -- `logits = hidden @ W.T` (N, V), then an fp32 `log_softmax` kept for backward --
holds two (N, V) fp32 tensors: for N = 16k tokens and a 152k vocabulary that is ~20 GB.
`token_logprobs` instead walks the tokens in chunks of `chunk_tokens` inside one autograd Function:
forward keeps only logsumexp, log-prob and entropy per token (N,); backward recomputes each chunk's
logits from the saved hidden states and head weight, so at most two (chunk, V) fp32 buffers live at
once and the full logits never exist (the recompute costs one extra head matmul per chunk).

Gradients used in backward, with z the chunk's logits, p = softmax(z), y the taken token:
  d logp_y / dz = onehot(y) - p
  d H / dz      = -p * (log p + H)           (H = -sum p log p, the entropy)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

DEFAULT_CHUNK_TOKENS = 2048


def _chunk_logits(h: Tensor, weight: Tensor, inv_temp: float) -> Tensor:
    """h (n, H), weight (V, H) -> logits (n, V), at least fp32, divided by the sampling temperature."""
    z = _at_least_fp32(torch.mm(h, weight.t()))  # (n, V)
    if inv_temp != 1.0:
        z.mul_(inv_temp)
    return z


class _FusedTokenLogprobs(torch.autograd.Function):
    """hidden (N, H), weight (V, H), targets (N,) -> logp (N,), entropy (N,), both at least fp32."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, inv_temp: float
    ) -> tuple[Tensor, Tensor]:
        n_tok = hidden.shape[0]
        stats_dtype = torch.promote_types(hidden.dtype, torch.float32)
        logp = torch.empty(n_tok, dtype=stats_dtype, device=hidden.device)  # (N,)
        ent = torch.empty_like(logp)  # (N,)
        lse = torch.empty_like(logp)  # (N,)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n_tok, chunk):
                e = min(s + chunk, n_tok)
                z = _chunk_logits(hidden[s:e], weight, inv_temp)  # (n, V)
                lse_c = torch.logsumexp(z, dim=-1)  # (n,)
                lse[s:e] = lse_c
                logp[s:e] = z.gather(1, targets[s:e, None]).squeeze(1) - lse_c
                p = torch.softmax(z, dim=-1)  # (n, V)
                ent[s:e] = lse_c - (p * z).sum(dim=-1)
                del z, p
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.chunk, ctx.inv_temp = chunk, inv_temp
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if g_logp is None and g_ent is None:
            return None, None, None, None, None
        grad_h = torch.empty_like(hidden) if need_h else None  # (N, H)
        w_dtype = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=w_dtype, device=weight.device) if need_w else None
        n_tok = hidden.shape[0]
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n_tok, ctx.chunk):
                e = min(s + ctx.chunk, n_tok)
                gz = _chunk_grad_logits(
                    hidden[s:e], weight, targets[s:e], lse[s:e], ent[s:e],
                    None if g_logp is None else g_logp[s:e],
                    None if g_ent is None else g_ent[s:e], ctx.inv_temp,
                ).to(hidden.dtype)  # (n, V)
                if grad_h is not None:
                    grad_h[s:e] = torch.mm(gz, weight)  # (n, H)
                if grad_w is not None:
                    grad_w.add_(torch.mm(gz.t(), hidden[s:e]))  # (V, H)
                del gz
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None


def _chunk_grad_logits(
    h: Tensor, weight: Tensor, t: Tensor, lse: Tensor, ent: Tensor,
    g_logp: Tensor | None, g_ent: Tensor | None, inv_temp: float,
) -> Tensor:
    """Gradient of sum(g_logp * logp + g_ent * H) w.r.t. the chunk's pre-temperature logits (n, V), fp32.

    Uses two (n, V) buffers: log p (in place on the logits) and p (in place into the result).
    """
    logp_all = _chunk_logits(h, weight, inv_temp).sub_(lse[:, None])  # (n, V) log p
    p = logp_all.exp()  # (n, V)
    coef = torch.zeros_like(logp_all) if g_ent is None else logp_all.add_(ent[:, None]).mul_(g_ent[:, None])
    if g_logp is not None:
        coef.add_(g_logp[:, None])  # (n, V) g_logp + g_ent * (log p + H)
    gz = p.mul_(coef).neg_()  # (n, V)
    if g_logp is not None:
        gz.scatter_add_(1, t[:, None], g_logp[:, None])  # + g_logp * onehot(y)
    if inv_temp != 1.0:
        gz.mul_(inv_temp)
    return gz


def token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target token and entropy of the same distribution, fused with the LM head.

    hidden (B, T, H), weight (V, H) (the LM head, no bias), targets (B, T) long
    -> (logp (B, T), entropy (B, T)), fp32 (fp64 for fp64 inputs). Logits are `hidden @ weight.T / temperature`.
    Under autocast the matmuls run in the autocast dtype; softmax statistics are always fp32.
    Never materialises more than `chunk_tokens` rows of logits at once (forward or backward).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b, t, h = hidden.shape
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)
    flat_h = hidden.reshape(b * t, h)  # (N, H)
    flat_t = targets.reshape(b * t)  # (N,)
    logp, ent = _FusedTokenLogprobs.apply(flat_h, weight, flat_t, chunk_tokens, 1.0 / temperature)
    return logp.view(b, t), ent.view(b, t)


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

"""One optimizer step over the micro-batches of a leased batch.

Gradient accumulation gives the same update as one big batch because every micro-batch's loss is
divided by the whole batch's counts (`global_denominator`): mask-1 tokens for `token-mean`,
sequences for the seq modes, summed over micro-batches and over ranks. DDP / FSDP average
gradients over ranks, so the counts are divided by the world size to cancel that average.
Gradients are synchronised only on the last micro-batch (DDP no_sync / FSDP2 gradient sync off).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from trainer.loss import Denominator, LossConfig, policy_loss
from trainer.packing import MicroBatch, empty_micro_batch
from trainer.parallel import all_reduce, grad_sync, unwrap, world_size
from trainer.policy import frozen_logprobs, sequence_logprobs

_MEAN_KEYS = (
    "pg_loss",
    "clip_frac_low",
    "clip_frac_high",
    "clip_frac_dual",
    "approx_kl",
    "ratio_mean",
    "entropy",
    "kl_ref",
    "tis_weight",
    "behaviour_mismatch",
)


@dataclass(frozen=True)
class StepConfig:
    """How one step runs.

    old_from_batch: False (default): a no-grad forward with the trainer's weights gives the old
    log-probs, and the sampler's log-probs in the batch become the behaviour policy of truncated IS
    (`loss.tis_cap`) and of the `behaviour_mismatch` metric -- correct whatever checkpoint, engine,
    precision or temperature handling the producer sampled with. True: trust the sampler's log-probs as
    the old policy (saves one forward; right only for on-policy data from an identical numerics stack).
    autocast: None = bf16 autocast on CUDA only; True / False force it on / off.
    """

    loss: LossConfig = field(default_factory=LossConfig)
    max_grad_norm: float | None = 1.0
    old_from_batch: bool = False
    autocast: bool | None = None


def global_denominator(mbs: Sequence[MicroBatch], device: torch.device) -> Denominator:
    """Mask-1 tokens and sequences over all micro-batches and ranks, divided by the world size."""
    local = torch.zeros(2, dtype=torch.float64, device=device)  # (tokens, seqs)
    for mb in mbs:
        m = mb.loss_mask > 0  # (S, Tm)
        local[0] += m.sum()
        local[1] += m.any(dim=-1).sum()
    total = all_reduce(local, "sum") / world_size()
    return Denominator(tokens=float(total[0]), seqs=float(total[1]))


def _even_count(mbs: Sequence[MicroBatch], device: torch.device) -> list[MicroBatch]:
    """Pad with empty micro-batches to the largest count over ranks: FSDP gathers parameters in
    every forward, so all ranks must run as many forwards and backwards."""
    most = int(all_reduce(torch.tensor(len(mbs), device=device), "max"))
    return list(mbs) + [empty_micro_batch() for _ in range(most - len(mbs))]


def _autocast(device: torch.device, flag: bool | None) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on CUDA by default; `flag` forces it on or off."""
    on = device.type == "cuda" if flag is None else flag
    return torch.autocast(device.type, dtype=torch.bfloat16) if on else contextlib.nullcontext()


def _micro_step(
    policy: nn.Module, mb: MicroBatch, cfg: StepConfig, denom: Denominator, ref: nn.Module | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Forward + loss + backward of one micro-batch: -> (loss (), metrics)."""
    old, behaviour = mb.old_logp, None  # (S, Tm)
    if not cfg.old_from_batch:
        old, behaviour = frozen_logprobs(unwrap(policy), mb), mb.old_logp
    ref_logp = frozen_logprobs(ref, mb) if ref is not None and cfg.loss.beta > 0 else None  # (S, Tm)
    logp, ent = sequence_logprobs(policy, mb)  # (S, Tm) x2
    loss, metrics = policy_loss(
        logp, old, mb.advantages, mb.loss_mask, cfg.loss, ref_logp, behaviour, entropy=ent, denom=denom
    )
    loss.backward()
    return loss.detach(), metrics


def _grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    """Clip gradients to `max_norm` (None: only measure) -> the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, float("inf") if max_norm is None else max_norm)
    full = getattr(norm, "full_tensor", None)  # FSDP2 returns a DTensor
    return float(full() if full is not None else norm)


def train_step(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[MicroBatch],
    cfg: StepConfig,
    ref_policy: nn.Module | None = None,
) -> dict[str, float]:
    """Accumulate gradients over `micro_batches`, clip, step: -> metrics (floats, reduced over ranks).

    policy: a PolicyLogprobs, possibly DDP / FSDP wrapped; ref_policy: the frozen reference
    (needed when cfg.loss.beta > 0). Every rank must call this with >= 1 micro-batch (ranks with
    fewer are padded with empty ones, so counts may differ). When the whole
    batch (all ranks) has no mask-1 token, nothing is stepped and `skipped` is 1. When the loss or the
    gradient norm is not finite (every rank sees the same reduced values), the gradients are dropped,
    nothing is stepped, and `skipped` and `nonfinite` are 1: the caller nacks the batch with a reason.
    """
    if cfg.loss.beta > 0 and ref_policy is None:
        raise ValueError("loss.beta > 0 needs a ref_policy")
    if not micro_batches:
        raise ValueError("train_step needs at least one micro-batch on every rank")
    device = next(policy.parameters()).device
    mbs = [mb.to(device) for mb in _even_count(micro_batches, device)]
    denom = global_denominator(mbs, device)
    if denom.tokens == 0:
        optimizer.zero_grad(set_to_none=True)
        return {"skipped": 1.0, "loss_tokens": 0.0}
    sums = torch.zeros(len(_MEAN_KEYS) + 3, dtype=torch.float64, device=device)  # weighted sums, loss, tokens
    ratio_max = torch.zeros((), dtype=torch.float64, device=device)
    policy.train()
    for i, mb in enumerate(mbs):
        with grad_sync(policy, sync=i == len(mbs) - 1), _autocast(device, cfg.autocast):
            loss, metrics = _micro_step(policy, mb, cfg, denom, ref_policy)
        n_tok = (mb.loss_mask > 0).sum()
        for k, key in enumerate(_MEAN_KEYS):
            if key in metrics:
                sums[k] += metrics[key].double() * n_tok
        sums[-3] += loss.double()
        sums[-2] += n_tok
        sums[-1] += mb.n_input_tokens
        ratio_max = torch.maximum(ratio_max, metrics["ratio_max"].double())
    grad_norm = _grad_norm([p for p in policy.parameters() if p.grad is not None], cfg.max_grad_norm)
    sums, ratio_max = all_reduce(sums, "sum"), all_reduce(ratio_max, "max")
    if not (math.isfinite(float(sums[-3])) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)  # one bad batch never writes NaN / inf into the weights
        return {"skipped": 1.0, "nonfinite": 1.0, "loss_tokens": float(sums[-2])}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return _finish_metrics(sums, ratio_max, cfg, grad_norm)


def _finish_metrics(sums: Tensor, ratio_max: Tensor, cfg: StepConfig, grad_norm: float) -> dict[str, float]:
    """Reduced weighted sums -> token-weighted means and totals."""
    tokens = float(sums[-2])
    out = {key: float(sums[k]) / tokens for k, key in enumerate(_MEAN_KEYS)}
    if cfg.loss.beta == 0:
        out.pop("kl_ref")
    if cfg.loss.tis_cap is None or cfg.old_from_batch:
        out.pop("tis_weight")
        out.pop("behaviour_mismatch")
    out.update(
        loss=float(sums[-3]) / world_size(),
        ratio_max=float(ratio_max),
        grad_norm=grad_norm,
        loss_tokens=tokens,
        input_tokens=float(sums[-1]),
        skipped=0.0,
    )
    return out

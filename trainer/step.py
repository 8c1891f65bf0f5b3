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

from trainer.loss import Denominator, LossConfig, count_denominator, policy_loss
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
    "behaviour_kl",
)
_BEHAVIOUR_KEYS = ("tis_weight", "behaviour_mismatch", "behaviour_kl")  # weighted by the tokens that have a behaviour policy
_LOSS, _TOKENS, _INPUT, _BEH = len(_MEAN_KEYS), len(_MEAN_KEYS) + 1, len(_MEAN_KEYS) + 2, len(_MEAN_KEYS) + 3


@dataclass(frozen=True)
class StepConfig:
    """How one batch is trained.

    old_from_batch: False (default): a no-grad forward with the trainer's weights gives the old
    log-probs, and the sampler's log-probs in the batch become the behaviour policy of truncated IS
    (`loss.tis_cap`) and of the `behaviour_mismatch` metric -- correct whatever checkpoint, engine,
    precision or temperature handling the producer sampled with; sequences without sampler log-probs
    have no behaviour policy (TIS weight 1, not in the mismatch). True: trust the sampler's log-probs
    as the old policy (saves one forward; right only for on-policy data from an identical numerics
    stack; every sequence must have them). A micro-batch with a resumed trajectory (its `versions` show
    tokens of several policy versions) is never trusted so: pi_old is recomputed for it and the stored
    log-probs are its behaviour policy, so the checkpoint's older tokens get their TIS weight per token.
    ppo_epochs / mini_batches: PPO-style several updates per batch (Schulman et al. 2017; verl's
    `ppo_epochs` / `ppo_mini_batch_size`): pi_old is computed once, before the first update, and kept
    fixed; the batch's trajectories are split into `mini_batches` consecutive mini-batches of whole
    trajectories (`trainer.packing.pack_mini_batches`, each packed into micro-batches as usual) and each
    epoch steps the optimizer once per non-empty mini-batch (a batch of fewer trajectories than
    `mini_batches` takes fewer: the `mini_batches` metric says how many). The default 1 / 1 is one on-policy step per batch:
    the ratio is exactly 1, so clipping, dual-clip and clip-higher never engage; with more updates the
    policy moves away from pi_old inside the batch and the clip does what it is for.
    autocast: None = bf16 autocast on CUDA only; True / False force it on / off.
    """

    loss: LossConfig = field(default_factory=LossConfig)
    max_grad_norm: float | None = 1.0
    old_from_batch: bool = False
    autocast: bool | None = None
    ppo_epochs: int = 1
    mini_batches: int = 1

    def __post_init__(self) -> None:
        for name in ("ppo_epochs", "mini_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass
class _Frozen:
    """What stays fixed across the updates of one batch, for one micro-batch (all (S, Tm))."""

    old: Tensor
    behaviour: Tensor | None
    ref: Tensor | None


def global_denominator(mbs: Sequence[MicroBatch], device: torch.device) -> Denominator:
    """Mask-1 tokens and sequences over all micro-batches and ranks, divided by the world size."""
    local = torch.zeros(2, dtype=torch.float64, device=device)  # (tokens, seqs)
    for mb in mbs:
        d = count_denominator(mb.loss_mask, mb.seq_shares)  # shared: a K-segment trajectory counts once
        local[0] += d.tokens
        local[1] += d.seqs
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


def _freeze(policy: nn.Module, mb: MicroBatch, cfg: StepConfig, ref: nn.Module | None) -> _Frozen:
    """pi_old (recomputed or the sampler's), the behaviour policy and the reference of one micro-batch."""
    if cfg.old_from_batch and mb.mixed is None:
        if mb.has_behaviour is not None:
            raise ValueError("old_from_batch needs the sampler's log-probs of every trajectory")
        old, behaviour = mb.old_logp, None
    else:
        old, behaviour = frozen_logprobs(unwrap(policy), mb), mb.old_logp
    with_ref = ref is not None and cfg.loss.beta > 0
    return _Frozen(old, behaviour, frozen_logprobs(ref, mb) if with_ref else None)  # type: ignore[arg-type]


def _micro_step(
    policy: nn.Module, mb: MicroBatch, frozen: _Frozen, cfg: StepConfig, denom: Denominator
) -> tuple[Tensor, dict[str, Tensor]]:
    """Forward + loss + backward of one micro-batch: -> (loss (), metrics)."""
    logp, ent = sequence_logprobs(policy, mb)  # (S, Tm) x2
    loss, metrics = policy_loss(
        logp, frozen.old, mb.advantages, mb.loss_mask, cfg.loss, frozen.ref, frozen.behaviour,
        entropy=ent, denom=denom, behaviour_rows=mb.has_behaviour, segments=mb.segments,
    )
    loss.backward()
    return loss.detach(), metrics


def _grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    """Clip gradients to `max_norm` (None: only measure) -> the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, float("inf") if max_norm is None else max_norm)
    full = getattr(norm, "full_tensor", None)  # FSDP2 returns a DTensor
    return float(full() if full is not None else norm)


def _behaviour_tokens(mb: MicroBatch) -> Tensor:
    """Mask-1 tokens of the sequences that have a behaviour policy."""
    m = mb.loss_mask > 0  # (S, Tm)
    return (m if mb.has_behaviour is None else m & mb.has_behaviour[:, None]).sum()


def _update(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    mbs: Sequence[MicroBatch],
    frozen: Sequence[_Frozen],
    cfg: StepConfig,
    sums: Tensor,
) -> tuple[str, float, Tensor]:
    """One optimizer step over `mbs` (one mini-batch, all ranks): adds its weighted metric sums into
    `sums` -> ("stepped" | "empty" | "nonfinite", grad norm, ratio max)."""
    device = sums.device
    denom = global_denominator(mbs, device)
    ratio_max = torch.zeros((), dtype=torch.float64, device=device)
    if denom.tokens == 0:
        return "empty", 0.0, ratio_max
    local = torch.zeros_like(sums)
    for i, (mb, fz) in enumerate(zip(mbs, frozen, strict=True)):
        with grad_sync(policy, sync=i == len(mbs) - 1), _autocast(device, cfg.autocast):
            loss, metrics = _micro_step(policy, mb, fz, cfg, denom)
        n_tok, n_beh = (mb.loss_mask > 0).sum(), _behaviour_tokens(mb)
        for k, key in enumerate(_MEAN_KEYS):
            if key in metrics:
                local[k] += metrics[key].double() * (n_beh if key in _BEHAVIOUR_KEYS else n_tok)
        local[_LOSS] += loss.double()
        local[_TOKENS] += n_tok
        local[_INPUT] += mb.n_input_tokens
        local[_BEH] += n_beh
        ratio_max = torch.maximum(ratio_max, metrics["ratio_max"].double())
    grad_norm = _grad_norm([p for p in policy.parameters() if p.grad is not None], cfg.max_grad_norm)
    local, ratio_max = all_reduce(local, "sum"), all_reduce(ratio_max, "max")
    if not (math.isfinite(float(local[_LOSS])) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)  # one bad batch never writes NaN / inf into the weights
        return "nonfinite", grad_norm, ratio_max
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sums += local
    return "stepped", grad_norm, ratio_max


def _mini_batches(micro_batches: Sequence[MicroBatch] | Sequence[Sequence[MicroBatch]], cfg: StepConfig,
                  ) -> list[list[MicroBatch]]:
    """train_step's argument as a list of mini-batches (a flat list of micro-batches is one)."""
    if not micro_batches:
        raise ValueError("train_step needs at least one micro-batch on every rank")
    if isinstance(micro_batches[0], MicroBatch):
        if cfg.mini_batches != 1:
            raise ValueError(f"mini_batches={cfg.mini_batches} splits trajectories: pass the mini-batches of "
                             "trainer.packing.pack_mini_batches (a list of lists of micro-batches), not a flat list")
        return [list(micro_batches)]  # type: ignore[arg-type]
    parts = [list(part) for part in micro_batches]  # type: ignore[arg-type]
    if len(parts) != cfg.mini_batches or not all(parts):
        raise ValueError(f"expected {cfg.mini_batches} non-empty mini-batches (pack_mini_batches), got "
                         f"{[len(p) for p in parts]} micro-batches each")
    return parts


def train_step(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[MicroBatch] | Sequence[Sequence[MicroBatch]],
    cfg: StepConfig,
    ref_policy: nn.Module | None = None,
) -> dict[str, float]:
    """Train on one batch: `cfg.ppo_epochs` x `cfg.mini_batches` optimizer steps (default one), each
    accumulating gradients over its micro-batches, clipping and stepping -> metrics (floats, reduced over
    ranks; means are token-weighted over every update, `updates` counts the steps taken, `mini_batches`
    the non-empty mini-batches of an epoch).

    micro_batches: the batch's micro-batches (one mini-batch), or with `cfg.mini_batches` > 1 its
    mini-batches, each a list of micro-batches (`trainer.packing.pack_mini_batches`).
    policy: a PolicyLogprobs, possibly DDP / FSDP wrapped; ref_policy: the frozen reference
    (needed when cfg.loss.beta > 0). Every rank must call this with >= 1 micro-batch per mini-batch (ranks
    with fewer are padded with empty ones, so counts may differ). pi_old is computed once, before the first
    update. When the whole batch (all ranks) has no mask-1 token, nothing is stepped and `skipped` is 1.
    When an update's loss or gradient norm is not finite (every rank sees the same reduced values), its
    gradients are dropped and no later update runs; the updates already applied stand. Nothing applied:
    `skipped` 1, `nonfinite` 1, `updates` 0 (the caller nacks the batch with a reason). Some applied: the
    metrics of those updates with `nonfinite_updates` 1 and `skipped` 0 (the batch was trained).
    """
    if cfg.loss.beta > 0 and ref_policy is None:
        raise ValueError("loss.beta > 0 needs a ref_policy")
    device = next(policy.parameters()).device
    minis = [[mb.to(device) for mb in _even_count(part, device)] for part in _mini_batches(micro_batches, cfg)]
    if global_denominator([mb for part in minis for mb in part], device).tokens == 0:
        optimizer.zero_grad(set_to_none=True)
        return {"skipped": 1.0, "loss_tokens": 0.0}
    policy.train()
    with _autocast(device, cfg.autocast):
        frozen = [[_freeze(policy, mb, cfg, ref_policy) for mb in part] for part in minis]  # pi_old fixed
    sums = torch.zeros(len(_MEAN_KEYS) + 4, dtype=torch.float64, device=device)
    ratio_max = torch.zeros((), dtype=torch.float64, device=device)
    norms: list[float] = []
    per_epoch: Tensor | None = None  # sums after the first epoch: the batch's token counts
    stepped_minis = 0
    for epoch in range(cfg.ppo_epochs):
        for part, fz in zip(minis, frozen, strict=True):
            outcome, norm, rmax = _update(policy, optimizer, part, fz, cfg, sums)
            if outcome == "nonfinite":
                if not norms:
                    return {"skipped": 1.0, "nonfinite": 1.0, "nonfinite_updates": 1.0, "updates": 0.0,
                            "loss_tokens": 0.0}
                out = _finish_metrics(sums, ratio_max, cfg, norms, sums if per_epoch is None else per_epoch)
                return out | {"nonfinite_updates": 1.0, "mini_batches": float(stepped_minis)}
            if outcome == "stepped":
                norms.append(norm)
                ratio_max = torch.maximum(ratio_max, rmax)
                stepped_minis += epoch == 0
        if per_epoch is None:
            per_epoch = sums.clone()
    assert per_epoch is not None
    return _finish_metrics(sums, ratio_max, cfg, norms, per_epoch) | {"mini_batches": float(stepped_minis)}


def _finish_metrics(sums: Tensor, ratio_max: Tensor, cfg: StepConfig, norms: list[float], epoch: Tensor,
                    ) -> dict[str, float]:
    """Reduced weighted sums over every update -> token-weighted means; token counts of one epoch (`epoch`:
    the sums after the first one, or of the updates taken when it did not finish)."""
    tokens, beh = float(sums[_TOKENS]), float(sums[_BEH])
    out = {key: float(sums[k]) / (beh if key in _BEHAVIOUR_KEYS else tokens)
           for k, key in enumerate(_MEAN_KEYS) if key not in _BEHAVIOUR_KEYS or beh > 0}
    if cfg.loss.beta == 0:
        out.pop("kl_ref")
    if cfg.loss.tis_cap is None or cfg.old_from_batch:
        out.pop("tis_weight", None)
        out.pop("behaviour_mismatch", None)
    if cfg.old_from_batch:  # pi_old is the sampler's: nothing measured (mixed micro-batches only, if any)
        out.pop("behaviour_kl", None)
    updates = len(norms)
    out.update(
        loss=float(sums[_LOSS]) / world_size() / updates,
        ratio_max=float(ratio_max),
        grad_norm=sum(norms) / updates,
        grad_norm_max=max(norms),
        updates=float(updates),
        loss_tokens=float(epoch[_TOKENS]),
        input_tokens=float(epoch[_INPUT]),
        skipped=0.0,
    )
    return out

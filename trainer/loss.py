"""GRPO policy loss as pure tensor functions.

Base objective: GRPO (Shao et al. 2024, "DeepSeekMath", eq. 3) -- the PPO clipped surrogate on
group-relative advantages plus beta * KL to a frozen reference.

Where this departs from the GRPO paper (every departure is a `LossConfig` switch):
- Aggregation (`agg`): the paper averages tokens within a sequence, then sequences
  (`seq-mean-token-mean`). The default for the token ratio is `token-mean` over all mask-1 tokens of
  the batch (DAPO, Yu et al. 2025, sec. 3.3), so long responses are not under-weighted; for the
  sequence ratio (GSPO) it is `seq-mean-token-mean` (`DEFAULT_AGG`). `seq-mean-token-sum`
  sums a sequence's tokens and averages sequences; `seq-mean-token-sum-norm` divides each sequence's
  token sum by one constant (`norm_tokens`, e.g. the generation budget) instead of its length:
  Dr. GRPO's unbiased aggregation (Liu et al. 2025, "Understanding R1-Zero-Like Training"), used with
  the `dr_grpo` advantage estimator (no std division) of the curation policy.
- Clip-higher: separate `eps_low` / `eps_high`, default 0.2 / 0.28 (DAPO sec. 3.1) for the token
  ratio; 3e-4 / 4e-4 for the sequence ratio (GSPO paper, sec. 5.1), whose values sit much closer to 1.
- Dual-clip (`dual_clip`, default c = 3; Ye et al. 2020, "Mastering Complex Control in MOBA Games"):
  for A < 0 the per-token loss is at most -c A, so a token whose ratio exploded (off-policy data)
  cannot dominate the batch; its gradient is then 0.
- `beta` defaults to 0 (DAPO, Dr. GRPO): no KL term and no reference model at all. With beta > 0,
  `kl_mode="loss"` adds beta * an estimator named by the gradient it gives (Schulman 2020,
  "Approximating KL divergence"; with r = pi / pi_ref on samples of pi):
  `k2` = (log r)^2 / 2: d/dtheta = log r * grad log pi, whose expectation is the gradient of the
  reverse KL(pi || pi_ref) -- the KL the GRPO objective names;
  `k3` = 1/r - 1 + log r (GRPO eq. 4): an unbiased low-variance estimate of KL(pi || pi_ref) as a
  value, but d/dtheta = (1 - 1/r) grad log pi, whose expectation is the gradient of the forward
  KL(pi_ref || pi). (k1 = log r as a loss has zero expected gradient, E[grad log pi] = 0, so it is not
  offered as a loss.) Both are *per-position* estimators: each token's term is differentiated at its
  own position only, so for multi-token responses the expected gradient is the sum over positions of
  the per-position KL gradients at the sampled prefixes, NOT the gradient of the sequence-level
  KL(pi(y) || pi_ref(y)), which also moves the earlier tokens towards prefixes whose continuations
  are closer to the reference (enumerated on a 2-step tabular policy in the tests: they differ).
  k3's value is clamped like verl's (log r to [-20, 20] before the exponential, the value to at most
  10), so one far-off token cannot make the batch non-finite. For the gradient of the sequence KL use
  `kl_mode="reward"`: it subtracts beta * k1 from the reward, each token's advantage becomes
  A - beta * sum_{s >= t} (old_logp_s - ref_logp_s) over mask-1 tokens (detached), the REINFORCE
  estimator of the gradient of E[R] - beta * KL(pi || pi_ref) -- exact in expectation.
- `ratio_level="sequence"`: GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"),
  the length-normalised sequence ratio s_i = exp(mean_t (logp - old_logp)), in the GSPO-token form
  s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]: each token's value is s_i, so a sequence is clipped as a
  whole. GSPO's objective weighs every sequence alike, 1/G sum_i min(s_i A_i, clip(s_i) A_i): that is
  `seq-mean-token-mean` (every token of sequence i carries s_i, so the token mean is s_i), the default
  `agg` of the sequence ratio. `token-mean` with the sequence ratio weighs sequence i by |y_i| / N (a
  length-weighted GSPO variant, not the paper's), and the token sums weigh it by |y_i|: allowed when
  set explicitly, never by default.
- Truncated importance sampling (`tis_cap`, default 2): when the sampler's log-probs (`behaviour_logp`)
  differ from the trainer's old-policy log-probs, each token's loss is weighted by
  min(exp(old_logp - behaviour_logp), C), detached (Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"); with the sequence ratio the weight is sequence-level
  too, min(exp(mean_t(old_logp - behaviour_logp)), C). `behaviour_mismatch` reports the mean
  |old_logp - behaviour_logp|. Whatever `tis_cap`, `behaviour_kl` reports the k3 estimate of
  KL(pi_sampler || pi_old) averaged over the tokens that have sampler log-probs (`behaviour_kl`); the
  service's `behaviour_mismatch` monitor reads it (docs/alerts.md).
- `entropy_coef`: optional entropy bonus (0 by default; the entropy is always reported).
Only tokens with loss mask 1 count, in every numerator and every denominator; a sequence with no
mask-1 token does not count as a sequence. Values at masked positions (even inf / NaN) change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k2", "k3"]
KLMode = Literal["loss", "reward"]
RatioLevel = Literal["token", "sequence"]
# default clip ranges (eps_low, eps_high) per ratio level: DAPO clip-higher; GSPO sec. 5.1
DEFAULT_CLIP: dict[str, tuple[float, float]] = {"token": (0.2, 0.28), "sequence": (3e-4, 4e-4)}
# default aggregation per ratio level: DAPO token-mean; GSPO's 1/G sum over sequences
DEFAULT_AGG: dict[str, str] = {"token": "token-mean", "sequence": "seq-mean-token-mean"}


def check_choice(kind: str, value: str, valid: tuple[str, ...]) -> None:
    """Raise ValueError naming the valid choices when `value` is not one of them."""
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True)
class LossConfig:
    """Switches of the policy loss; see the module docstring for the papers behind each.

    eps_low / eps_high / agg None: the defaults of the ratio level (`DEFAULT_CLIP`, `DEFAULT_AGG`:
    `ratio_level="sequence"` alone is GSPO as the paper writes it). norm_tokens: the
    constant of `seq-mean-token-sum-norm` (required by it). dual_clip: c > 1, None turns it off.
    """

    eps_low: float | None = None
    eps_high: float | None = None
    agg: AggMode | None = None
    beta: float = 0.0
    kl_estimator: KLEstimator = "k2"
    kl_mode: KLMode = "loss"
    ratio_level: RatioLevel = "token"
    tis_cap: float | None = 2.0
    dual_clip: float | None = 3.0
    norm_tokens: int | None = None
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        check_choice("ratio_level", self.ratio_level, get_args(RatioLevel))
        if self.agg is None:
            object.__setattr__(self, "agg", DEFAULT_AGG[self.ratio_level])
        check_choice("agg", self.agg, get_args(AggMode))  # type: ignore[arg-type]
        if self.kl_estimator == "k1":
            raise ValueError(
                "kl_estimator 'k1' as a loss has zero expected gradient; use k2 (gradient of KL(pi || ref)), "
                "k3 (gradient of KL(ref || pi)), or kl_mode 'reward' (k1 subtracted from the reward)"
            )
        check_choice("kl_estimator", self.kl_estimator, get_args(KLEstimator))
        check_choice("kl_mode", self.kl_mode, get_args(KLMode))
        low, high = DEFAULT_CLIP[self.ratio_level]
        object.__setattr__(self, "eps_low", low if self.eps_low is None else self.eps_low)
        object.__setattr__(self, "eps_high", high if self.eps_high is None else self.eps_high)
        if self.eps_low < 0 or self.eps_high < 0 or self.beta < 0:  # type: ignore[operator]
            raise ValueError("eps_low, eps_high and beta must be >= 0")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0 or None, got {self.tis_cap}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 or None, got {self.dual_clip}")
        if (self.agg == "seq-mean-token-sum-norm") != (self.norm_tokens is not None):
            raise ValueError("norm_tokens (> 0) is required by agg 'seq-mean-token-sum-norm' and only by it")
        if self.norm_tokens is not None and self.norm_tokens <= 0:
            raise ValueError(f"norm_tokens must be > 0, got {self.norm_tokens}")

    @property
    def clip(self) -> tuple[float, float]:
        """(eps_low, eps_high), resolved."""
        return float(self.eps_low), float(self.eps_high)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Denominator:
    """Loss normalisers fixed for a whole (accumulated, possibly multi-rank) batch.

    tokens: mask-1 tokens (for `token-mean`); seqs: sequences with >= 1 mask-1 token (seq modes).
    Passing the whole batch's counts to every micro-batch makes gradient accumulation give the same
    update as one big batch (under data parallelism the counts of all ranks, divided by the world
    size, since DDP averages gradients: see `trainer.step.global_denominator`).
    """

    tokens: float
    seqs: float


def count_denominator(mask: Tensor, shares: Tensor | None = None) -> Denominator:
    """mask (B, T), shares (B,) or None -> the Denominator of this batch alone (shared counts: sequence s
    counts `shares[s]` times; each of a trajectory's K trained segments is 1/K of it, so it counts once)."""
    m = mask > 0
    if shares is None:
        return Denominator(tokens=float(m.sum()), seqs=float(m.any(dim=-1).sum()))
    c = shares.to(torch.float64)
    return Denominator(tokens=float((m.sum(dim=-1) * c).sum()), seqs=float((m.any(dim=-1) * c).sum()))


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` over positions where mask > 0, in float64 (a metric: a float32 sum of large legal
    values, e.g. |log pi_old - log pi_behaviour| near 1e5 over many tokens, must not overflow):
    (B, T), (B, T) -> float64 scalar (0 when none)."""
    m = mask > 0
    return torch.where(m, values.double(), 0.0).sum() / m.sum().clamp_min(1)


def _seq_sums(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """-> per-sequence masked sums (B,), mask-1 counts (B,), has-token flags (B,)."""
    m = mask > 0
    n = m.sum(dim=-1)  # (B,)
    return torch.where(m, values, 0.0).sum(dim=-1), n, n > 0


def _nonzero(count: float) -> float:
    """A denominator that is 1 when there is nothing to divide (the numerator is then 0)."""
    return count if count > 0 else 1.0


@dataclass(frozen=True)
class Segments:
    """Per-sequence weights of segmented trajectories (B,) each (docs/training.md, "Segmented trajectories"):
    `weights` w_s multiply sequence s's loss in the numerator (1/K for segments that each carry the
    trajectory's advantage, 1 for `divide`'s shares A/K); `shares` c_s are its part of its trajectory in the
    denominator (1/K for each of K trained segments, 1 unsegmented), so every trajectory counts once."""

    weights: Tensor
    shares: Tensor


def _token_mean(values: Tensor, mask: Tensor, denom: Denominator | None, seg: Segments | None) -> Tensor:
    m = mask > 0
    vals = torch.where(m, values, 0.0)
    if seg is None:
        return vals.sum() / (m.sum().clamp_min(1) if denom is None else _nonzero(denom.tokens))
    total = (vals.sum(dim=-1) * seg.weights).sum()
    local = (m.sum(dim=-1) * seg.shares).sum()
    return total / (local.clamp_min(1e-12) if denom is None else _nonzero(denom.tokens))


def _seq_mean(values: Tensor, mask: Tensor, denom: Denominator | None, per_token_mean: bool, norm: float,
              seg: Segments | None) -> Tensor:
    sums, n, has = _seq_sums(values, mask)  # (B,), (B,), (B,)
    per_seq = sums / n.clamp_min(1) if per_token_mean else sums / norm  # (B,)
    if seg is None:
        return per_seq.sum() / (has.sum().clamp_min(1) if denom is None else _nonzero(denom.seqs))
    local = (has * seg.shares).sum()
    return (per_seq * seg.weights).sum() / (local.clamp_min(1e-12) if denom is None else _nonzero(denom.seqs))


_AGGREGATORS: dict[str, Callable[[Tensor, Tensor, Denominator | None, float, Segments | None], Tensor]] = {
    "token-mean": lambda v, m, d, _, s: _token_mean(v, m, d, s),
    "seq-mean-token-mean": lambda v, m, d, _, s: _seq_mean(v, m, d, True, 1.0, s),
    "seq-mean-token-sum": lambda v, m, d, _, s: _seq_mean(v, m, d, False, 1.0, s),
    "seq-mean-token-sum-norm": lambda v, m, d, norm, s: _seq_mean(v, m, d, False, norm, s),
}


def aggregate(
    values: Tensor, mask: Tensor, mode: str, denom: Denominator | None = None, norm_tokens: float | None = None,
    segments: Segments | None = None,
) -> Tensor:
    """Reduce per-token losses to a scalar: values (B, T), mask (B, T) -> ().

    token-mean: sum of mask-1 values / number of mask-1 tokens (DAPO).
    seq-mean-token-mean: mean over sequences of each sequence's token mean (GRPO paper).
    seq-mean-token-sum: mean over sequences of each sequence's token sum.
    seq-mean-token-sum-norm: mean over sequences of each sequence's token sum / norm_tokens (Dr. GRPO).
    `denom` replaces this batch's counts by those of the whole accumulated batch.
    `segments` (segmented trajectories, the per-rollout mean; `Segments`): token-mean =
    sum_s w_s sum_t m_st l_st / sum_s c_s n_s and the seq modes = sum_s w_s l_s / sum_s c_s [n_s > 0], so a
    K-segment trajectory counts once in the denominator whatever K. None: every w_s = c_s = 1.
    """
    check_choice("aggregation mode", mode, tuple(_AGGREGATORS))
    if mode == "seq-mean-token-sum-norm" and not (norm_tokens and norm_tokens > 0):
        raise ValueError("seq-mean-token-sum-norm needs norm_tokens > 0")
    seg = None if segments is None else Segments(segments.weights.to(values.dtype), segments.shares.to(values.dtype))
    return _AGGREGATORS[mode](values, mask, denom, float(norm_tokens or 1.0), seg)


_KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {
    "k1": lambda log_r: log_r,  # log_r = logp - ref_logp
    "k2": lambda log_r: 0.5 * log_r.square(),
    "k3": lambda log_r: _k3(log_r),
}
K3_LOG_RATIO_CLAMP = 20.0  # |log r| bound before exp: exp(20) is finite in fp32 and bf16
K3_MAX = 10.0  # verl's clamp of the k3 value


def _k3(log_r: Tensor) -> Tensor:
    """k3 = 1/r - 1 + log r with log r clamped to +-20 and the value to [0, 10] (finite with a finite
    gradient everywhere; 0 gradient where clamped): (B, T) -> (B, T)."""
    lr = log_r.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(-lr) + lr - 1.0).clamp(0.0, K3_MAX)


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token KL estimators from samples of pi, log r = logp - ref_logp: (B, T), (B, T) -> (B, T).

    k1 = log r (unbiased value of KL(pi || ref); zero expected gradient, used only in the reward);
    k2 = (log r)^2 / 2 (per position, gradient: that of KL(pi || ref)); k3 = 1/r - 1 + log r (>= 0,
    unbiased value of KL(pi || ref), GRPO eq. 4; gradient: that of KL(ref || pi); clamped, see `_k3`).
    Per-position estimators, not the sequence KL's gradient: see the module docstring.
    """
    check_choice("kl_estimator", estimator, tuple(_KL_ESTIMATORS))
    return _KL_ESTIMATORS[estimator](logp - ref_logp)


def behaviour_kl(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_sampler || pi_old) from the sampler's own samples, detached:
    log r = behaviour_logp - old_logp, k3 = exp(-log r) - 1 + log r (>= 0, unbiased: E_sampler[pi_old /
    pi_sampler] = 1; clamped like `_k3`); 0 off the mask. (B, T) x3 -> (B, T)."""
    log_r = torch.where(mask > 0, behaviour_logp - old_logp, 0.0).detach()  # (B, T)
    return torch.where(mask > 0, _k3(log_r), 0.0)


def kl_reward_to_go(old_logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """sum_{s >= t} k1_s over mask-1 tokens, k1 = old_logp - ref_logp, detached: (B, T) x3 -> (B, T)."""
    k1 = torch.where(mask > 0, old_logp - ref_logp, 0.0).detach()  # (B, T)
    return k1.flip(-1).cumsum(-1).flip(-1)


def log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """log of the importance ratio, 0 at masked positions: (B, T) x3 -> (B, T).

    token: logp - old_logp. sequence (GSPO-token): sg[mean_t(logp - old_logp)] + logp - sg[logp].
    """
    check_choice("ratio_level", level, get_args(RatioLevel))
    m = mask > 0
    tok = torch.where(m, logp - old_logp, 0.0)  # (B, T)
    if level == "token":
        return tok
    seq = tok.sum(dim=-1) / m.sum(dim=-1).clamp_min(1)  # (B,)
    return torch.where(m, seq.detach()[:, None] + logp - logp.detach(), 0.0)  # (B, T)


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> Tensor:
    """Per-token PPO loss -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A): (B, T), (B, 1|T) -> (B, T).

    dual_clip c: where A < 0 the loss is min(that, -c A), bounded whatever the ratio.
    """
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    loss = -torch.minimum(ratio * adv, clipped * adv)  # (B, T)
    if dual_clip is None:
        return loss
    return torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)


def clip_fractions(
    ratio: Tensor, adv: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """Fractions of mask-1 tokens whose clip is active (zero gradient): (low, high) scalars.

    low: ratio < 1 - eps_low with A < 0; high: ratio > 1 + eps_high with A > 0.
    """
    adv = adv.expand_as(ratio)
    low = ((ratio < 1.0 - eps_low) & (adv < 0)).float()  # (B, T)
    high = ((ratio > 1.0 + eps_high) & (adv > 0)).float()  # (B, T)
    return masked_mean(low, mask), masked_mean(high, mask)


def tis_weights(
    old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, cap: float, level: str = "token"
) -> Tensor:
    """Truncated IS weights min(pi_old / pi_sampler, C), detached: (B, T) x3 -> (B, T).

    token: per-token ratio, 1 at masked positions. sequence: the length-normalised sequence ratio
    exp(mean_t(old - behaviour)) on every token of the sequence, matching GSPO's ratio.
    """
    m = mask > 0
    log_w = torch.where(m, old_logp - behaviour_logp, 0.0)  # (B, T)
    if level == "sequence":
        log_w = (log_w.sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp_min(1)).expand_as(log_w)
    else:
        check_choice("ratio_level", level, get_args(RatioLevel))
    return torch.exp(log_w).clamp(max=cap).detach()


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig,
    ref_logp: Tensor | None = None,
    behaviour_logp: Tensor | None = None,
    *,
    entropy: Tensor | None = None,
    denom: Denominator | None = None,
    behaviour_rows: Tensor | None = None,
    segments: Segments | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO loss of one (micro-)batch and its metrics.

    logp, old_logp, mask (B, T); advantages (B,); ref_logp (B, T) when cfg.beta > 0;
    behaviour_logp (B, T) enables TIS when cfg.tis_cap is set; behaviour_rows (B,) bool marks the
    sequences that have behaviour log-probs (None: all do): the others get TIS weight 1 and count in
    neither `tis_weight` nor `behaviour_mismatch` (absent when no sequence has them); entropy (B, T) is
    reported and used when cfg.entropy_coef > 0; `segments` weighs segments (see `aggregate`).
    -> (loss (), metrics of 0-dim detached tensors).
    """
    m = mask > 0
    if cfg.beta > 0 and ref_logp is None:
        raise ValueError("cfg.beta > 0 needs ref_logp")
    metrics: dict[str, Tensor] = {}
    adv = advantages.to(logp.dtype)[:, None]  # (B, 1)
    if cfg.beta > 0 and cfg.kl_mode == "reward":
        rtg = kl_reward_to_go(old_logp, ref_logp, mask)  # type: ignore[arg-type]  # (B, T)
        adv = adv - cfg.beta * rtg  # (B, T)
        metrics["kl_ref"] = masked_mean(torch.where(m, old_logp - ref_logp, 0.0), mask)  # type: ignore[operator]
    ratio = torch.exp(log_ratio(logp, old_logp, mask, cfg.ratio_level))  # (B, T)
    low, high = cfg.clip
    per_tok = clipped_surrogate(ratio, adv, low, high, cfg.dual_clip)  # (B, T)
    if behaviour_logp is not None:
        beh_mask = mask if behaviour_rows is None else mask * behaviour_rows[:, None].to(mask.dtype)  # (B, T)
        if bool((beh_mask > 0).any()):
            metrics["behaviour_kl"] = masked_mean(behaviour_kl(old_logp, behaviour_logp, beh_mask), beh_mask)
    if cfg.tis_cap is not None and behaviour_logp is not None:
        if behaviour_rows is not None:  # no behaviour policy: weight exp(0) = 1
            behaviour_logp = torch.where(behaviour_rows[:, None], behaviour_logp, old_logp)  # (B, T)
        w = tis_weights(old_logp, behaviour_logp, mask, cfg.tis_cap, cfg.ratio_level)  # (B, T)
        per_tok = per_tok * w
        if bool((beh_mask > 0).any()):
            metrics["tis_weight"] = masked_mean(w, beh_mask)
            metrics["behaviour_mismatch"] = masked_mean(  # the difference in float64 too
                torch.where(m, old_logp.double() - behaviour_logp.double(), 0.0).abs(), beh_mask
            )
    agg = cfg.agg
    assert agg is not None  # resolved to the ratio level's default by LossConfig.__post_init__
    metrics["pg_loss"] = aggregate(per_tok.detach(), mask, agg, None, cfg.norm_tokens)
    if cfg.beta > 0 and cfg.kl_mode == "loss":
        kl = kl_penalty(torch.where(m, logp, 0.0), torch.where(m, ref_logp, 0.0), cfg.kl_estimator)  # type: ignore[arg-type]
        per_tok = per_tok + cfg.beta * kl
        metrics["kl_ref"] = masked_mean(kl.detach(), mask)
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy.detach(), mask)
        if cfg.entropy_coef > 0:
            per_tok = per_tok - cfg.entropy_coef * torch.where(m, entropy, 0.0)
    loss = aggregate(per_tok, mask, agg, denom, cfg.norm_tokens, segments)
    metrics.update(_ratio_metrics(logp.detach(), old_logp, ratio.detach(), adv, mask, cfg))
    return loss, metrics


def _ratio_metrics(
    logp: Tensor, old_logp: Tensor, ratio: Tensor, adv: Tensor, mask: Tensor, cfg: LossConfig
) -> dict[str, Tensor]:
    """Clip fractions, ratio mean / max and approx KL(old || new) = mean((r - 1) - log r), token ratio.

    clip_frac_dual: mask-1 tokens with A < 0 whose loss the dual clip bounds (ratio > c).
    """
    low, high = clip_fractions(ratio, adv, mask, *cfg.clip)
    tok_lr = torch.where(mask > 0, logp - old_logp, 0.0)  # (B, T)
    approx_kl = masked_mean(torch.expm1(tok_lr) - tok_lr, mask)
    ratio_max = torch.where(mask > 0, ratio, 0.0).max() if ratio.numel() else ratio.new_zeros(())
    c = float("inf") if cfg.dual_clip is None else cfg.dual_clip
    dual = ((ratio > c) & (adv.expand_as(ratio) < 0)).to(ratio.dtype)  # (B, T)
    return {
        "clip_frac_low": low,
        "clip_frac_high": high,
        "clip_frac_dual": masked_mean(dual, mask),
        "approx_kl": approx_kl,
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": ratio_max,
    }

"""Every loss function against a loop written here (values and gradients), plus hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.loss import (
    Denominator,
    LossConfig,
    aggregate,
    clip_fractions,
    count_denominator,
    kl_penalty,
    masked_mean,
    policy_loss,
    tis_weights,
)

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
NORM = 7  # the constant of seq-mean-token-sum-norm in these tests
MASK = torch.tensor(
    [[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 1]], dtype=torch.float64
)


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def loop_aggregate(per_tok: dict, mask: torch.Tensor, mode: str, denom: Denominator | None = None, norm=NORM):
    """per_tok: {(i, t): scalar} for the mask-1 positions."""
    rows = [[per_tok[(i, t)] for t in range(mask.shape[1]) if mask[i, t] > 0] for i in range(mask.shape[0])]
    rows = [r for r in rows if r]
    zero = torch.zeros((), dtype=torch.float64)
    if mode == "token-mean":
        n = denom.tokens if denom else sum(len(r) for r in rows)
        return sum((x for r in rows for x in r), zero) / max(n, 1)
    scale = {
        "seq-mean-token-sum": lambda r: 1,
        "seq-mean-token-mean": len,
        "seq-mean-token-sum-norm": lambda r: norm,
    }
    per_seq = [sum(r, zero) / scale[mode](r) for r in rows]
    return sum(per_seq, zero) / max(denom.seqs if denom else len(rows), 1)


def loop_policy_loss(logp, old, adv, mask, cfg: LossConfig, ref=None, behaviour=None, entropy=None):
    """Token by token; the sequence ratio (GSPO) is exp of the mean log-ratio, with its full gradient."""
    per_tok = {}
    for i in range(mask.shape[0]):
        toks = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        seq_ratio = torch.exp(sum(logp[i, t] - old[i, t] for t in toks) / len(toks)) if toks else None
        for t in toks:
            r = torch.exp(logp[i, t] - old[i, t]) if cfg.ratio_level == "token" else seq_ratio
            if cfg.ratio_level == "sequence" and cfg.beta > 0 and cfg.kl_mode == "reward":
                # per-token advantages: GSPO-token (GSPO sec. 4.3), sg[s_i] * pi_t / sg[pi_t]
                r = seq_ratio.detach() * torch.exp(logp[i, t] - logp[i, t].detach())
            a = float(adv[i])
            if cfg.beta > 0 and cfg.kl_mode == "reward":  # k1 of this and every later mask-1 token
                a -= cfg.beta * sum(float(old[i, u] - ref[i, u]) for u in toks if u >= t)
            loss = -torch.minimum(r * a, torch.clamp(r, 1 - cfg.eps_low, 1 + cfg.eps_high) * a)
            if cfg.dual_clip is not None and a < 0:
                loss = torch.minimum(loss, torch.tensor(-cfg.dual_clip * a, dtype=loss.dtype))
            if cfg.tis_cap is not None and behaviour is not None:
                if cfg.ratio_level == "token":
                    log_w = float(old[i, t] - behaviour[i, t])
                else:
                    log_w = sum(float(old[i, u] - behaviour[i, u]) for u in toks) / len(toks)
                loss = loss * min(math.exp(log_w), cfg.tis_cap)
            if cfg.beta > 0 and cfg.kl_mode == "loss":
                log_r = logp[i, t] - ref[i, t]
                kl = 0.5 * log_r**2 if cfg.kl_estimator == "k2" else torch.exp(-log_r) - 1 + log_r
                loss = loss + cfg.beta * kl
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * entropy[i, t]
            per_tok[(i, t)] = loss
    return loop_aggregate(per_tok, mask, cfg.agg, norm=cfg.norm_tokens)


def _loss_inputs(seed: int = 0):
    old = -_rand(seed, 4, 6).abs() - 0.1
    logp = (old + 0.4 * _rand(seed + 1, 4, 6)).requires_grad_()
    adv = torch.tensor([1.2, -0.7, 0.5, 0.9], dtype=torch.float64) * _rand(seed + 2, 4).sign()
    ref = old + 0.5 * _rand(seed + 3, 4, 6)
    behaviour = old + 0.8 * _rand(seed + 4, 4, 6)
    entropy = _rand(seed + 5, 4, 6).abs().requires_grad_()
    return logp, old, adv, ref, behaviour, entropy


def _cfg(agg: str, **kw) -> LossConfig:
    return LossConfig(agg=agg, norm_tokens=NORM if agg == "seq-mean-token-sum-norm" else None, **kw)


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(
    ("beta", "estimator", "kl_mode"),
    [(0.0, "k2", "loss"), (0.1, "k2", "loss"), (0.1, "k3", "loss"), (0.1, "k2", "reward")],
)
@pytest.mark.parametrize(("tis_cap", "dual_clip"), [(None, None), (1.5, 3.0), (2.0, 1.2)])
def test_policy_loss_matches_loop(agg, level, beta, estimator, kl_mode, tis_cap, dual_clip):
    # eps 0.2 / 0.28 for both levels: the sequence ratios here are far from 1, so GSPO's 3e-4 would clip all
    cfg = _cfg(
        agg,
        ratio_level=level,
        beta=beta,
        kl_estimator=estimator,
        kl_mode=kl_mode,
        tis_cap=tis_cap,
        dual_clip=dual_clip,
        entropy_coef=0.01,
        eps_low=0.2,
        eps_high=0.28,
    )
    logp, old, adv, ref, behaviour, entropy = _loss_inputs()
    loss, metrics = policy_loss(logp, old, adv, MASK, cfg, ref, behaviour, entropy=entropy)
    g_logp, g_ent = torch.autograd.grad(loss, [logp, entropy])
    ref_loss = loop_policy_loss(logp, old, adv, MASK, cfg, ref, behaviour, entropy)
    r_logp, r_ent = torch.autograd.grad(ref_loss, [logp, entropy])
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(g_logp, r_logp)
    torch.testing.assert_close(g_ent, r_ent)
    assert set(metrics) >= {
        "pg_loss",
        "clip_frac_low",
        "clip_frac_high",
        "approx_kl",
        "entropy",
        "ratio_mean",
    }


def test_clipping_is_active_in_the_test_inputs():
    logp, old, adv, *_ = _loss_inputs()
    _, metrics = policy_loss(logp, old, adv, MASK, LossConfig(eps_low=0.1, eps_high=0.1))
    assert float(metrics["clip_frac_low"]) > 0 and float(metrics["clip_frac_high"]) > 0


@pytest.mark.parametrize("mode", AGGS)
def test_aggregate_matches_loop(mode):
    values = _rand(7, 4, 6)
    per_tok = {(i, t): values[i, t] for i in range(4) for t in range(6) if MASK[i, t] > 0}
    got = aggregate(values, MASK, mode, norm_tokens=NORM)
    torch.testing.assert_close(got, loop_aggregate(per_tok, MASK, mode))
    denom = Denominator(tokens=20.0, seqs=5.0)
    torch.testing.assert_close(
        aggregate(values, MASK, mode, denom, NORM), loop_aggregate(per_tok, MASK, mode, denom)
    )


def test_aggregate_hand_values():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(values, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    # Dr. GRPO: one constant for every sequence, so a long sequence's tokens weigh as much as a short one's
    assert float(aggregate(values, mask, "seq-mean-token-sum-norm", norm_tokens=4)) == pytest.approx(
        (6 / 4 + 4 / 4) / 2
    )
    with pytest.raises(ValueError, match="norm_tokens"):
        aggregate(values, mask, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_matches_loop(estimator):
    logp, ref = _rand(1, 3, 4), _rand(2, 3, 4)
    out = kl_penalty(logp, ref, estimator)
    for i in range(3):
        for t in range(4):
            lr = float(logp[i, t] - ref[i, t])
            want = {"k1": lr, "k2": 0.5 * lr * lr, "k3": math.exp(-lr) + lr - 1}[estimator]
            assert float(out[i, t]) == pytest.approx(want)
    assert float(kl_penalty(logp, logp, estimator).abs().max()) == 0.0


def test_k3_is_nonnegative_and_k1_is_not():
    logp, ref = _rand(3, 5, 5), _rand(4, 5, 5)
    assert bool((kl_penalty(logp, ref, "k3") >= 0).all())
    assert bool((kl_penalty(logp, ref, "k1") < 0).any())


def _exact_kl_grads(theta: torch.Tensor, ref_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact gradients of KL(pi || ref) and KL(ref || pi) for a categorical pi = softmax(theta)."""
    theta = theta.detach().requires_grad_()
    logp, logq = torch.log_softmax(theta, -1), torch.log_softmax(ref_logits, -1)
    (g_rev,) = torch.autograd.grad((logp.exp() * (logp - logq)).sum(), theta)
    theta = theta.detach().requires_grad_()
    logp = torch.log_softmax(theta, -1)
    (g_fwd,) = torch.autograd.grad((logq.exp() * (logq - logp)).sum(), theta)
    return g_rev, g_fwd


def _expected_estimator_grad(theta: torch.Tensor, ref_logits: torch.Tensor, estimator: str) -> torch.Tensor:
    """E_{y ~ pi}[grad of the estimator at y], summed exactly over the categories (no sampling noise)."""
    theta = theta.detach().requires_grad_()
    logp_all = torch.log_softmax(theta, -1)  # (V,)
    logq = torch.log_softmax(ref_logits, -1)
    weights = logp_all.exp().detach()  # the sampling distribution is not differentiated
    values = kl_penalty(logp_all[None], logq[None], estimator)[0]  # (V,) estimator at each y
    (g,) = torch.autograd.grad((weights * values).sum(), theta)
    return g


def test_kl_estimators_follow_the_gradient_they_are_named_for():
    theta, ref_logits = _rand(11, 6), _rand(12, 6)
    g_rev, g_fwd = _exact_kl_grads(theta, ref_logits)
    torch.testing.assert_close(_expected_estimator_grad(theta, ref_logits, "k2"), g_rev)
    torch.testing.assert_close(_expected_estimator_grad(theta, ref_logits, "k3"), g_fwd)
    zero = _expected_estimator_grad(theta, ref_logits, "k1")  # k1 as a loss: no expected gradient
    torch.testing.assert_close(zero, torch.zeros_like(zero))
    assert not torch.allclose(g_rev, g_fwd)  # the two KLs really differ here


def test_kl_in_reward_follows_the_reverse_kl_gradient():
    """One-token sequences of a categorical policy, on-policy (old = logp): E[grad loss] with the
    k1-in-reward advantage, summed exactly over the categories, is beta * grad KL(pi || ref)."""
    theta, ref_logits = _rand(13, 5), _rand(14, 5)
    g_rev, _ = _exact_kl_grads(theta, ref_logits)
    theta = theta.detach().requires_grad_()
    logp_all = torch.log_softmax(theta, -1)  # (V,)
    logq = torch.log_softmax(ref_logits, -1)
    cfg = LossConfig(beta=0.5, kl_mode="reward", agg="seq-mean-token-sum", dual_clip=None)
    total = torch.zeros((), dtype=torch.float64)
    for y in range(5):  # E over y ~ pi, exactly
        lp = logp_all[y].reshape(1, 1)
        loss, _ = policy_loss(
            lp, lp.detach(), torch.zeros(1, dtype=torch.float64), torch.ones(1, 1), cfg, logq[y].reshape(1, 1)
        )
        total = total + logp_all[y].exp().detach() * loss
    (g,) = torch.autograd.grad(total, theta)
    torch.testing.assert_close(g, 0.5 * g_rev)


def test_dual_clip_bounds_the_loss_for_negative_advantages():
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.tensor([[0.0, 1.0, 3.0, 8.0]], dtype=torch.float64, requires_grad=True)  # ratios 1 .. e^8
    adv = torch.tensor([-2.0], dtype=torch.float64)
    mask = torch.ones(1, 4)
    cfg = LossConfig(agg="seq-mean-token-sum", dual_clip=3.0)
    loss, metrics = policy_loss(logp, old, adv, mask, cfg)
    # per token: min(-r A, -3 A) for ratios past 1 + eps_high: 2 * 1, then min(2e, 6), 6, 6
    assert float(loss.detach()) == pytest.approx(2.0 + 2 * math.e + 6.0 + 6.0)
    (g,) = torch.autograd.grad(loss, logp)
    assert g[0, 2] == 0 and g[0, 3] == 0 and g[0, 1] != 0  # bounded tokens give no gradient
    assert float(metrics["clip_frac_dual"]) == pytest.approx(0.5)
    unbounded, _ = policy_loss(logp, old, adv, mask, LossConfig(agg="seq-mean-token-sum", dual_clip=None))
    assert float(unbounded.detach()) > 5000  # -A e^8 without it
    pos, _ = policy_loss(logp, old, -adv, mask, cfg)  # A > 0: clip-higher already bounds it, dual clip idle
    pos_plain, _ = policy_loss(logp, old, -adv, mask, LossConfig(agg="seq-mean-token-sum", dual_clip=None))
    assert float(pos.detach()) == float(pos_plain.detach())


def test_gspo_has_its_own_clip_defaults():
    assert LossConfig().clip == (0.2, 0.28)
    assert LossConfig(ratio_level="sequence").clip == (3e-4, 4e-4)
    assert LossConfig(ratio_level="sequence", eps_low=0.1).clip == (0.1, 4e-4)  # a given value wins
    # a sequence whose mean log-ratio is 1e-3 is clipped under GSPO's range (A > 0), not under 0.28
    logp = torch.full((1, 4), 1e-3, dtype=torch.float64, requires_grad=True)
    old, adv, mask = (
        torch.zeros(1, 4, dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
        torch.ones(1, 4),
    )
    _, m = policy_loss(logp, old, adv, mask, LossConfig(ratio_level="sequence"))
    assert float(m["clip_frac_high"]) == 1.0


def test_off_policy_defaults():
    cfg = LossConfig()
    assert (cfg.tis_cap, cfg.dual_clip, cfg.kl_estimator, cfg.kl_mode) == (2.0, 3.0, "k2", "loss")
    logp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    behaviour = torch.tensor([[-5.0, 0.0, 3.0]], dtype=torch.float64)  # weights e^5, 1, e^-3
    _, m = policy_loss(
        logp, logp.detach(), torch.ones(1, dtype=torch.float64), torch.ones(1, 3), cfg, None, behaviour
    )
    assert float(m["tis_weight"]) == pytest.approx((2.0 + 1.0 + math.exp(-3)) / 3)  # capped at 2
    assert float(m["behaviour_mismatch"]) == pytest.approx(8 / 3)


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masked_tokens_change_nothing(agg, level):
    for kl_mode in ("loss", "reward"):
        cfg = _cfg(agg, ratio_level=level, beta=0.1, kl_mode=kl_mode, tis_cap=2.0, entropy_coef=0.01)
        _check_masked_change_nothing(cfg)


def _check_masked_change_nothing(cfg: LossConfig) -> None:
    logp, old, adv, ref, behaviour, entropy = _loss_inputs(3)
    garbage = MASK == 0
    values = [t.detach().clone() for t in (logp, old, ref, behaviour, entropy)]
    for t, bad in zip(values, [float("nan"), float("inf"), -float("inf"), 1e30, float("nan")], strict=True):
        t[garbage] = bad
    dirty_logp, dirty_ent = values[0].requires_grad_(), values[4].requires_grad_()
    clean, _ = policy_loss(logp, old, adv, MASK, cfg, ref, behaviour, entropy=entropy)
    dirty, _ = policy_loss(dirty_logp, values[1], adv, MASK, cfg, values[2], values[3], entropy=dirty_ent)
    g_clean = torch.autograd.grad(clean, [logp, entropy])
    g_dirty = torch.autograd.grad(dirty, [dirty_logp, dirty_ent])
    torch.testing.assert_close(dirty, clean)
    for a, b in zip(g_clean, g_dirty, strict=True):
        torch.testing.assert_close(b, a)
        assert float(b[garbage].abs().max()) == 0.0


@pytest.mark.parametrize("agg", AGGS)
def test_accumulated_halves_equal_the_whole_batch(agg):
    cfg = _cfg(agg, beta=0.05)
    logp, old, adv, ref, *_ = _loss_inputs(5)
    whole, _ = policy_loss(logp, old, adv, MASK, cfg, ref)
    g_whole = torch.autograd.grad(whole, logp)[0]
    denom = count_denominator(MASK)
    parts = [
        policy_loss(logp[s], old[s], adv[s], MASK[s], cfg, ref[s], denom=denom)[0]
        for s in (slice(0, 1), slice(1, 4))
    ]
    g_parts = torch.autograd.grad(parts[0] + parts[1], logp)[0]
    torch.testing.assert_close(parts[0] + parts[1], whole)
    torch.testing.assert_close(g_parts, g_whole)


def test_fully_masked_sequence_is_not_a_sequence():
    assert count_denominator(MASK) == Denominator(tokens=12.0, seqs=3.0)
    values = torch.ones(4, 6, dtype=torch.float64)
    assert float(aggregate(values, MASK, "seq-mean-token-mean")) == pytest.approx(1.0)


def test_on_policy_loss_is_minus_mean_advantage():
    logp = -torch.rand(2, 3, dtype=torch.float64).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    loss, metrics = policy_loss(logp, logp.detach(), adv, mask, LossConfig())
    assert float(loss.detach()) == pytest.approx(-(2 * 1.0 + 3 * -0.5) / 5)
    grad = torch.autograd.grad(loss, logp)[0]
    torch.testing.assert_close(grad, -adv[:, None] * mask / 5)
    assert float(metrics["approx_kl"]) == 0.0 and float(metrics["ratio_mean"]) == pytest.approx(1.0)


def test_clip_fractions_hand_values():
    ratio = torch.tensor([[0.5, 1.0, 1.5, 0.7]])
    adv = torch.tensor([[-1.0, 1.0, 1.0, 1.0]])
    low, high = clip_fractions(ratio, adv, torch.ones(1, 4), eps_low=0.2, eps_high=0.28)
    assert float(low) == pytest.approx(0.25) and float(high) == pytest.approx(0.25)


def test_sequence_ratio_clips_a_sequence_as_a_whole():
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = torch.tensor([[0.05, 0.6, 0.6]], dtype=torch.float64, requires_grad=True)  # mean 0.4: s = 1.49
    adv = torch.tensor([1.0], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    seq_loss, _ = policy_loss(logp, old, adv, mask, LossConfig(ratio_level="sequence"))
    assert float(torch.autograd.grad(seq_loss, logp)[0].abs().max()) == 0.0  # every token clipped
    tok_loss, _ = policy_loss(logp, old, adv, mask, LossConfig(ratio_level="token"))
    assert float(torch.autograd.grad(tok_loss, logp)[0][0, 0]) != 0.0  # token 0 alone is not


def test_tis_weights_are_capped_and_detached():
    old = torch.tensor([[-1.0, -2.0, -1.0]], requires_grad=True)
    behaviour = torch.tensor([[-2.0, -1.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = tis_weights(old, behaviour, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, math.exp(-1.0), 1.0]]))
    assert not w.requires_grad
    seq = tis_weights(old, behaviour - torch.tensor([[0.0, 0.5, 0.0]]), mask, cap=2.0, level="sequence")
    torch.testing.assert_close(seq, torch.full((1, 3), math.exp(0.25)))  # geometric mean over mask-1 tokens


def test_all_masked_batch_gives_zero_loss_not_nan():
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = policy_loss(logp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), LossConfig())
    assert float(loss.detach()) == 0.0 and all(math.isfinite(float(v)) for v in metrics.values())
    assert float(masked_mean(torch.ones(2, 2), torch.zeros(2, 2))) == 0.0


def test_unknown_names_raise_listing_valid_ones():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum"):
        LossConfig(agg="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k2, k3"):
        LossConfig(kl_estimator="k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="zero expected gradient"):
        LossConfig(kl_estimator="k1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="norm_tokens"):
        LossConfig(agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="token, sequence"):
        LossConfig(ratio_level="group")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="valid"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")
    with pytest.raises(ValueError, match="valid"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k9")


def test_beta_without_reference_raises():
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), LossConfig(beta=0.1)
        )


# -- 3. GSPO with its defaults is not GSPO's objective ------------------------------------------------
# Attack: ratio_level="sequence" kept token-mean aggregation (each sequence weighed by its length): not GSPO's objective.


def test_sequence_ratio_with_default_config_is_the_gspo_objective():
    """GSPO (Zheng et al. 2025, eq. 5): J = 1/G sum_i min(s_i A_i, clip(s_i, 1-eps_l, 1+eps_h) A_i) with
    s_i = exp(mean_t(log pi - log pi_old)) -- every sequence weighs the same. `ratio_level="sequence"`
    gets GSPO's clip ranges by default but keeps agg="token-mean", which weighs each sequence by its
    length (the loss module says the gradient "equals sequence-level GSPO under any of the
    aggregations"). Reference: GSPO written out in float64, gradients compared."""
    torch.manual_seed(0)
    lengths = [2, 6, 4]
    b, t = len(lengths), max(lengths)
    mask = torch.zeros(b, t, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logp0 = torch.randn(b, t, dtype=torch.float64) * 0.3 - 1.0
    old = logp0 + torch.randn(b, t, dtype=torch.float64) * 1e-4  # inside and outside the 3e-4 clip
    adv = torch.tensor([1.0, -0.5, 0.7], dtype=torch.float64)

    cfg = LossConfig(ratio_level="sequence", tis_cap=None)
    low, high = cfg.clip
    assert (low, high) == (3e-4, 4e-4)
    lp = logp0.clone().requires_grad_()
    loss, _ = policy_loss(lp, old, adv, mask, cfg)
    loss.backward()

    ref_lp = logp0.clone().requires_grad_()
    terms = []
    for i, n in enumerate(lengths):
        s = torch.exp((ref_lp[i, :n] - old[i, :n]).mean())
        terms.append(-torch.minimum(s * adv[i], s.clamp(1 - low, 1 + high) * adv[i]))
    ref = torch.stack(terms).mean()
    ref.backward()

    assert float(loss) == pytest.approx(float(ref), rel=1e-9)
    torch.testing.assert_close(lp.grad, ref_lp.grad, rtol=1e-9, atol=1e-12)

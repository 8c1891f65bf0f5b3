"""What each KL option's gradient is, enumerated exactly on a 2-step tabular policy.

A one-step categorical cannot tell a per-position estimator from the sequence KL's gradient (there is
one position); two steps can: the sequence KL also moves the first token towards prefixes whose
continuation is closer to the reference. Every expectation below is an exact sum over the K^2
sequences, in float64, through the real `policy_loss`.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from trainer.loss import K3_MAX, LossConfig, kl_penalty, policy_loss

K = 3


def _tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logit tables of the first and the second step; small enough that k3 stays below its clamp."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(K, generator=gen, dtype=torch.float64) * 0.8,
            torch.randn(K, K, generator=gen, dtype=torch.float64) * 0.8)  # (K,), (K, K)


def _logp(first: torch.Tensor, second: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Per-position log-probs of the sequence (a, b): (2,)."""
    return torch.stack([torch.log_softmax(first, -1)[a], torch.log_softmax(second[a], -1)[b]])


def _sequences():
    return list(itertools.product(range(K), range(K)))


def _expected_grad(loss_of, first, second):
    """sum_y pi(y) (detached) * grad loss(y): the expectation of the estimator's gradient under pi."""
    total = torch.zeros(())
    for a, b in _sequences():
        weight = _logp(first, second, a, b).sum().exp().detach()
        total = total + weight * loss_of(a, b)
    return torch.autograd.grad(total, [first, second])


def _loss(kl_mode: str, estimator: str, ref_first, ref_second, first, second):
    cfg = LossConfig(beta=1.0, kl_mode=kl_mode, kl_estimator=estimator, agg="seq-mean-token-sum",
                     tis_cap=None, dual_clip=None)

    def loss_of(a: int, b: int) -> torch.Tensor:
        logp = _logp(first, second, a, b)[None]  # (1, 2)
        ref = _logp(ref_first, ref_second, a, b)[None]  # (1, 2)
        loss, _ = policy_loss(logp, logp.detach(), torch.zeros(1, dtype=torch.float64),
                              torch.ones(1, 2, dtype=torch.float64), cfg, ref)
        return loss

    return loss_of


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return (lp.exp() * (lp - lq)).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_mode_reward_gives_the_gradient_of_the_sequence_kl(seed):
    first, second = (t.requires_grad_() for t in _tables(seed))
    ref_first, ref_second = _tables(seed + 100)
    seq_kl = sum(_logp(first, second, a, b).sum().exp()
                 * (_logp(first, second, a, b).sum() - _logp(ref_first, ref_second, a, b).sum())
                 for a, b in _sequences())
    want = torch.autograd.grad(seq_kl, [first, second])
    got = _expected_grad(_loss("reward", "k2", ref_first, ref_second, first, second), first, second)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_k2_and_k3_as_losses_are_per_position_estimators_not_the_sequence_kl(seed, estimator):
    """k2's expected gradient is sum_t E_h grad KL(pi(.|h) || ref(.|h)) with the prefix distribution held
    fixed, k3's the same with the forward KL(ref(.|h) || pi(.|h)) -- and neither is the sequence KL's."""
    first, second = (t.requires_grad_() for t in _tables(seed))
    ref_first, ref_second = _tables(seed + 100)
    for a, b in _sequences():  # the regime where k3's clamp is not active (the clamp zeroes gradients)
        log_r = (_logp(first, second, a, b) - _logp(ref_first, ref_second, a, b)).detach()
        assert float(kl_penalty(log_r[None], torch.zeros(1, 2, dtype=torch.float64), "k3").max()) < K3_MAX
    got = _expected_grad(_loss("loss", estimator, ref_first, ref_second, first, second), first, second)

    def kl(p, q):
        return _kl(p, q) if estimator == "k2" else _kl(q, p)

    prefix = torch.softmax(first, -1).detach()  # P(h_2 = a), held fixed
    per_position = kl(first, ref_first) + sum(prefix[a] * kl(second[a], ref_second[a]) for a in range(K))
    want = torch.autograd.grad(per_position, [first, second])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-10)
    seq_kl = sum(_logp(first, second, a, b).sum().exp()
                 * (_logp(first, second, a, b).sum() - _logp(ref_first, ref_second, a, b).sum())
                 for a, b in _sequences())
    seq_grad = torch.autograd.grad(seq_kl, [first, second])
    assert max(float((g - s).abs().max()) for g, s in zip(got, seq_grad, strict=True)) > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("log_r", [-100.0, -94.9, -20.0, 30.0, 100.0])
def test_k3_is_finite_with_a_finite_gradient_far_from_the_reference(dtype, log_r):
    logp = torch.tensor([[log_r, -1.0]], dtype=dtype, requires_grad=True)  # (1, 2)
    ref = torch.zeros(1, 2, dtype=dtype)
    k3 = kl_penalty(logp, ref, "k3")
    (grad,) = torch.autograd.grad(k3.sum(), [logp])
    assert bool(torch.isfinite(k3).all()) and float(k3.detach().max()) <= K3_MAX
    assert bool(torch.isfinite(grad).all())
    cfg = LossConfig(beta=0.1, kl_estimator="k3")
    loss, metrics = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), cfg, ref)
    (grad,) = torch.autograd.grad(loss, [logp])
    assert bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())
    assert float(metrics["kl_ref"]) <= K3_MAX


def test_k3_keeps_its_exact_value_near_the_reference():
    log_r = torch.linspace(-2, 2, 13, dtype=torch.float64)[None]  # (1, 13)
    torch.testing.assert_close(kl_penalty(log_r, torch.zeros_like(log_r), "k3"),
                               torch.exp(-log_r) + log_r - 1.0)

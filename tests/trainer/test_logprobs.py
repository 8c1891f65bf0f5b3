"""Fused LM-head log-probs against a loop written here, values and gradients; memory bound checked by
recording every tensor the ops produce."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.logprobs import entropy_plain, token_logprobs, token_logprobs_plain


def loop_logprobs(hidden, weight, targets, temperature=1.0):
    """One token at a time: logits as dot products, log-sum-exp by hand, entropy = -sum p log p."""
    b, t, _ = hidden.shape
    logps, ents = [], []
    for i in range(b):
        for j in range(t):
            z = [torch.dot(hidden[i, j], weight[v]) / temperature for v in range(weight.shape[0])]
            zmax = max(float(x.detach()) for x in z)
            lse = zmax + torch.log(sum(torch.exp(x - zmax) for x in z))
            logps.append(z[int(targets[i, j])] - lse)
            ents.append(-sum(torch.exp(x - lse) * (x - lse) for x in z))
    return torch.stack(logps).view(b, t), torch.stack(ents).view(b, t)


def _inputs(b=2, t=3, h=5, v=11, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(v, h, generator=g, dtype=dtype).requires_grad_()
    targets = torch.randint(0, v, (b, t), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("impl", ["inplace", "functional"])
@pytest.mark.parametrize("chunk", [1, 4, 6, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_loop_values_and_gradients(chunk, temperature, impl):
    hidden, weight, targets = _inputs()
    g = torch.Generator().manual_seed(1)
    w_lp, w_ent = (
        torch.randn(2, 3, generator=g, dtype=torch.float64),
        torch.randn(2, 3, generator=g, dtype=torch.float64),
    )

    lp, ent = token_logprobs(hidden, weight, targets, chunk_tokens=chunk, temperature=temperature, impl=impl)
    gh, gw = torch.autograd.grad((lp * w_lp + ent * w_ent).sum(), [hidden, weight])
    ref_lp, ref_ent = loop_logprobs(hidden, weight, targets, temperature)
    rh, rw = torch.autograd.grad((ref_lp * w_lp + ref_ent * w_ent).sum(), [hidden, weight])

    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(gh, rh)
    torch.testing.assert_close(gw, rw)


def test_gradcheck_logp_only_and_entropy_only():
    hidden, weight, targets = _inputs(b=1, t=3, h=3, v=5)
    assert torch.autograd.gradcheck(lambda h, w: token_logprobs(h, w, targets, 2)[0], (hidden, weight))
    assert torch.autograd.gradcheck(lambda h, w: token_logprobs(h, w, targets, 2)[1], (hidden, weight))


def test_plain_reference_matches_loop():
    hidden, weight, targets = _inputs(seed=3)
    logits = hidden @ weight.T
    ref_lp, ref_ent = loop_logprobs(hidden, weight, targets, 0.5)
    torch.testing.assert_close(token_logprobs_plain(logits, targets, 0.5), ref_lp)
    torch.testing.assert_close(entropy_plain(logits, 0.5), ref_ent)


def test_frozen_weight_gets_no_gradient_and_hidden_still_does():
    hidden, weight, targets = _inputs()
    weight = weight.detach()
    lp, _ = token_logprobs(hidden, weight, targets, 2)
    lp.sum().backward()
    ref_h = hidden.detach().clone().requires_grad_()
    token_logprobs_plain(ref_h @ weight.T, targets).sum().backward()
    torch.testing.assert_close(hidden.grad, ref_h.grad)


def test_logprobs_are_normalised_and_entropy_bounded():
    hidden, weight, targets = _inputs(b=1, t=2, v=7)
    with torch.no_grad():
        total = torch.stack(
            [token_logprobs(hidden, weight, torch.full_like(targets, v))[0] for v in range(7)]
        )
        ent = token_logprobs(hidden, weight, targets)[1]
    torch.testing.assert_close(total.exp().sum(0), torch.ones(1, 2, dtype=torch.float64))
    assert bool((ent >= 0).all()) and bool((ent <= math.log(7) + 1e-9).all())


def test_bf16_autocast_close_to_fp32():
    hidden, weight, targets = _inputs(b=2, t=8, h=16, v=50, dtype=torch.float32)
    ref = token_logprobs(hidden, weight, targets)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = token_logprobs(hidden, weight, targets, chunk_tokens=5)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(lp, ref, atol=0.15, rtol=0.05)
    lp.sum().backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32


class MaxNumel(TorchDispatchMode):
    """Records the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


@pytest.mark.parametrize("impl", ["inplace", "functional"])
def test_never_materialises_the_full_logits(impl):
    b, t, v, h, chunk = 4, 16, 300, 6, 8  # full logits: 19,200 values; one chunk: 2,400
    hidden, weight, targets = _inputs(b=b, t=t, h=h, v=v, dtype=torch.float32)
    with MaxNumel() as fused:
        lp, ent = token_logprobs(hidden, weight, targets, chunk_tokens=chunk, impl=impl)
        (lp.sum() + ent.sum()).backward()
    with MaxNumel() as plain:
        token_logprobs_plain(hidden @ weight.T, targets).sum().backward()
    assert fused.max_numel == chunk * v
    assert plain.max_numel == b * t * v


def test_bad_arguments_raise():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logprobs(hidden, weight, targets, chunk_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match="inplace, functional, compiled"):
        token_logprobs(hidden, weight, targets, impl="triton")


@pytest.mark.parametrize("impl", ["inplace", "functional"])
def test_per_position_temperature_matches_loop(impl):
    hidden, weight, targets = _inputs(b=2, t=3)
    temps = torch.tensor([[0.5, 0.5, 0.5], [1.3, 1.3, 0.9]], dtype=torch.float64)  # a group each, mixed
    lp, ent = token_logprobs(hidden, weight, targets, chunk_tokens=4, temperature=temps, impl=impl)
    gh, gw = torch.autograd.grad((lp + 0.3 * ent).sum(), [hidden, weight])
    ref_lp, ref_ent = [], []
    for i in range(2):
        for j in range(3):
            a, b = loop_logprobs(hidden[i : i + 1, j : j + 1], weight, targets[i : i + 1, j : j + 1], float(temps[i, j]))
            ref_lp.append(a.reshape(()))
            ref_ent.append(b.reshape(()))
    ref_lp_t, ref_ent_t = torch.stack(ref_lp).view(2, 3), torch.stack(ref_ent).view(2, 3)
    rh, rw = torch.autograd.grad((ref_lp_t + 0.3 * ref_ent_t).sum(), [hidden, weight])
    torch.testing.assert_close(lp, ref_lp_t)
    torch.testing.assert_close(ent, ref_ent_t)
    torch.testing.assert_close(gh, rh)
    torch.testing.assert_close(gw, rw)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(hidden, weight, targets, temperature=temps * 0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(hidden, weight, targets, temperature=temps[:, :2])


@pytest.mark.parametrize("offset", [0.0, 100.0, 1000.0])
@pytest.mark.parametrize("gap", [5.0, 12.0, 25.0])
def test_entropy_of_a_peaked_distribution_matches_float64(offset, gap):
    """fp32 logits [offset + gap, offset, ..., offset]: the entropy (~ V e^-gap (gap + 1)) is tiny next to
    the logits and must keep its digits; `lse - sum p z` loses them once offset is large."""
    v = 50
    hidden = torch.ones(1, 4, 1)  # (1, 4, 1)
    weight = torch.full((v, 1), offset)
    weight[7, 0] = offset + gap  # (V, 1)
    targets = torch.tensor([[7, 7, 0, 3]])
    lp, ent = token_logprobs(hidden, weight, targets)
    z64 = (hidden.double() @ weight.double().T)[0, 0]  # (V,)
    logp64 = torch.log_softmax(z64, -1)
    ref = float(-(logp64.exp() * logp64).sum())  # float64 reference
    assert ref > 0
    assert float((ent - ref).abs().max()) / ref < 1e-4, (ent, ref)
    torch.testing.assert_close(lp[0].double(), logp64[targets[0]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gap", [120.0, 200.0, 1000.0])
def test_entropy_where_probabilities_underflow_to_zero_is_finite_and_the_naive_formula_is_not(gap):
    """fp32 logits [gap, 0, ..., 0] with gap > 104: e^-gap is below half the smallest fp32 subnormal
    (1.4e-45), so softmax gives exactly 0 for the V - 1 others (IEEE fp32, whatever the build). The naive
    -(p * log p).sum() then has 0 * log 0 = 0 * -inf = nan; ours is finite and matches float64 (the true
    entropy ~ V gap e^-gap, far below any fp32 resolution near 0: absolute tolerance)."""
    v = 50
    hidden = torch.ones(1, 2, 1)  # (1, 2, 1)
    weight = torch.zeros(v, 1)
    weight[7, 0] = gap  # (V, 1)
    z = (hidden @ weight.T)[0, 0]  # (V,) fp32
    p = torch.softmax(z, -1)
    assert int((p == 0).sum()) == v - 1  # the premise: exact zeros in fp32
    naive = -(p * p.log()).sum()
    assert math.isnan(float(naive))  # control: the naive formula cannot pass this test
    lp, ent = token_logprobs(hidden, weight, torch.tensor([[7, 0]]))
    z64 = z.double()
    logp64 = torch.log_softmax(z64, -1)
    ref = float(-(logp64.exp() * logp64).sum())
    assert bool(torch.isfinite(ent).all()) and bool(torch.isfinite(lp).all())
    assert float((ent.double() - ref).abs().max()) <= 1e-30, (ent, ref)
    torch.testing.assert_close(lp[0].double(), logp64[[7, 0]], rtol=1e-6, atol=1e-4)
    plain = entropy_plain(z[None, None])  # the log-softmax form of the reference: finite too
    assert math.isfinite(float(plain))

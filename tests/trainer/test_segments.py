"""Segmented trajectories in the trainer: the per-rollout mean (a K-segment trajectory weighs like one
trajectory, in the loss and in its gradients, on a real tiny Qwen2; `divide` trains exactly as `broadcast`)
and packing that keeps a trajectory's segments in one micro-batch when they fit the budget, spreads them
when they do not (never one micro-batch over the budget), and never splits them across mini-batches."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch

from tests.trainer.batches import make_trajectory, tiny_model
from trainer.loss import LossConfig, Segments, aggregate, count_denominator
from trainer.packing import pack_batch, sequences_from_batch
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _segmented(traj: dict, segments: list[dict], mode: str | None = "broadcast") -> dict:
    """A trajectory dict carrying `segments` (copies of the given trajectories' arrays) and, as the service
    sends it, its policy's `segment_advantage` (None: left out, as from a service that did not send it)."""
    segs = [{"segment_index": k, "is_last": k == len(segments) - 1, "token_ids": s["token_ids"],
             "loss_mask": s["loss_mask"], "logprobs": s["logprobs"], "advantage": traj["advantage"]}
            for k, s in enumerate(segments)]
    out = {**traj, "token_ids": None, "loss_mask": None, "logprobs": None, "segments": segs}
    return out if mode is None else {**out, "segment_advantage": mode}


def _batch(*trajs: dict) -> dict:
    trajectories = [{**t, "index": i} for i, t in enumerate(trajs)]
    return {"groups": [{"id": "g", "prompt_id": "p", "policy_version": 0, "trajectories": trajectories}]}


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("seed", range(4))
def test_weighted_aggregate_and_its_gradient_match_a_per_rollout_loop(agg, seed, shared):
    """Random segments of random trajectories: the weighted aggregate equals the hand-written per-rollout
    mean, value and gradient (seq modes: mean over trajectories of the mean over their segments; token
    mean: sum_s w_s sum_t l / sum_s c_s n_s), with numerator weights w_s = 1/K (segments that carry A) or,
    `shared`, w_s = 1 on values already divided by K (`divide`'s shares): the same loss either way."""
    rng = random.Random(seed)
    ks = [rng.randint(1, 10) for _ in range(rng.randint(1, 5))]  # segments per trajectory
    rows = sum(ks)
    t = 9
    mask = torch.tensor([[float(rng.random() < 0.6) for _ in range(t)] for _ in range(rows)], dtype=torch.float64)
    mask[:, 0] = 1.0  # every segment trained (K counts trained segments)
    values = torch.randn(rows, t, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    values.requires_grad_(True)
    shares = torch.tensor([1.0 / k for k in ks for _ in range(k)], dtype=torch.float64)
    norm = 7.0
    if shared:  # divide: each segment's values carry 1/K already, weighed 1 in the numerator
        got = aggregate(values * shares[:, None], mask, agg, None, norm if agg.endswith("norm") else None,
                        Segments(torch.ones_like(shares), shares))
    else:
        got = aggregate(values, mask, agg, None, norm if agg.endswith("norm") else None, Segments(shares, shares))
    (g_got,) = torch.autograd.grad(got, values)

    ref_vals = values.detach().clone().requires_grad_(True)
    per_traj, tok_num, tok_den, row = [], 0.0, 0.0, 0
    for k in ks:
        seg_losses = []
        for _ in range(k):
            toks = [ref_vals[row, j] for j in range(t) if mask[row, j] > 0]
            n = len(toks)
            total = sum(toks)
            seg_losses.append({"seq-mean-token-mean": total / n, "seq-mean-token-sum": total,
                               "seq-mean-token-sum-norm": total / norm, "token-mean": None}[agg])
            tok_num = tok_num + total / k
            tok_den += n / k
            row += 1
        if agg != "token-mean":
            per_traj.append(sum(seg_losses) / k)
    ref = tok_num / tok_den if agg == "token-mean" else sum(per_traj) / len(ks)
    (g_ref,) = torch.autograd.grad(ref, ref_vals)
    assert float(got) == pytest.approx(float(ref), rel=1e-12)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-10, atol=1e-12)
    d = count_denominator(mask, shares)
    assert d.seqs == pytest.approx(len(ks))  # each trajectory counts once


def _step(batch: dict, agg: str, budget: int = 10_000, mode: str = "pad") -> dict:
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = StepConfig(loss=LossConfig(agg=agg, norm_tokens=7 if agg.endswith("norm") else None))
    train_step(PolicyLogprobs(model, 6), opt, pack_batch(batch, budget, mode), cfg)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("agg", AGGS)
def test_a_ten_segment_trajectory_weighs_like_a_one_segment_one_with_the_same_reward(agg):
    """Real tiny Qwen2 + SGD: a trajectory of ten copies of segment S trains exactly like S alone (next to
    another trajectory T), whatever the packing; counted as ten trajectories it would weigh ten times."""
    rng = random.Random(3)
    s = make_trajectory(rng, 0, 3, 6)
    other = make_trajectory(rng, 1, 4, 5)
    s["advantage"], other["advantage"] = 1.25, -0.5
    one = _step(_batch(_segmented(s, [s]), other), agg)
    ten_batch = _batch(_segmented(s, [s] * 10), other)
    for budget, mode in [(10_000, "pad"), (10_000, "pack"), (12, "pad"), (12, "pack")]:
        ten = _step(ten_batch, agg, budget, mode)
        assert _max_diff(one, ten) < 2e-6, (budget, mode)
    naive = _step(_batch(*([s] * 10), other), agg)  # ten separate trajectories
    assert _max_diff(one, naive) > 1e-4


def test_segments_take_their_own_advantages_and_one_over_k_weights():
    rng = random.Random(0)
    segs = [make_trajectory(rng, 0, 2, 3) for _ in range(4)]
    traj = _segmented(make_trajectory(rng, 0, 2, 3), segs)
    for k, seg in enumerate(traj["segments"]):
        seg["advantage"] = 0.5 * k
    traj["segments"][1]["loss_mask"] = [0] * len(segs[1]["loss_mask"])  # nothing to train: not counted in K
    seqs = sequences_from_batch(_batch(traj, make_trajectory(rng, 1, 2, 3)))
    assert [q.advantage for q in seqs[:3]] == [0.0, 1.0, 1.5]
    assert [q.weight for q in seqs] == [1 / 3, 1 / 3, 1 / 3, 1.0]
    assert len({q.unit for q in seqs[:3]}) == 1 and seqs[3].unit == -1


GOLDEN = (math.sqrt(5) - 1) / 2  # gamma + gamma^2 = 1: discount advantages that sum to A


@pytest.mark.parametrize(("k", "untrained"), [(3, None), (3, 2), (4, 3), (2, None)])
@pytest.mark.parametrize("mode", ["broadcast", "divide", "discount"])
def test_the_weight_comes_from_the_delivered_mode_not_the_advantages(mode, k, untrained):
    """The delivered `segment_advantage` decides: 1 for divide, 1/K for broadcast / discount, even where
    discount's trained advantages sum to A (gamma (sqrt 5 - 1) / 2; an untrained last segment leaves
    A gamma^2 + A gamma = A), which the fallback guess takes for divide."""
    from filters.segments import segment_advantages

    rng = random.Random(k)
    whole = {**make_trajectory(rng, 0, 2, 3), "advantage": float(np.float32(0.8))}
    traj = _segmented(whole, [make_trajectory(rng, 0, 2, 3) for _ in range(k)], mode)
    trained = k - (untrained is not None)
    for s, a in zip(traj["segments"], segment_advantages(0.8, k, mode, GOLDEN, trained), strict=True):
        s["advantage"] = float(np.float32(a))  # as delivered: float32
    if untrained is not None:
        traj["segments"][untrained]["loss_mask"] = [0] * len(traj["segments"][untrained]["loss_mask"])
    seqs = sequences_from_batch(_batch(traj))
    assert [q.weight for q in seqs] == [1.0 if mode == "divide" else 1.0 / trained] * trained
    guessed = sequences_from_batch(_batch({k: v for k, v in traj.items() if k != "segment_advantage"}))
    sums_to_a = mode == "divide" or (mode == "discount" and trained == 2 and k == 3)
    assert [q.weight for q in guessed] == [1.0 if sums_to_a else 1.0 / trained] * trained  # the old guess


def test_an_unknown_delivered_mode_is_refused_naming_the_trajectory():
    rng = random.Random(0)
    traj = _segmented(make_trajectory(rng, 0, 2, 3), [make_trajectory(rng, 0, 2, 3)] * 2, "sum")
    with pytest.raises(ValueError, match="trajectory 0: segment_advantage must be one of"):
        sequences_from_batch(_batch(traj))


@pytest.mark.parametrize("mode", ["pad", "pack"])
@pytest.mark.parametrize("seed", range(3))
def test_packing_keeps_a_trajectorys_segments_together_when_they_fit(mode, seed):
    """Budgets from below one segment to above the whole batch: a trajectory whose segments fit the budget
    together is in one micro-batch, all or none; one that does not is spread, and then no micro-batch of more
    than one sequence is over the budget (a 256-segment trajectory cannot force one huge micro-batch); every
    sequence is packed exactly once, and the denominator shares still sum to one per trajectory."""
    rng = random.Random(seed)
    trajs = []
    for i in range(6):
        k = rng.randint(1, 6)
        base = make_trajectory(rng, i, rng.randint(1, 4), rng.randint(1, 8))
        trajs.append(_segmented(base, [make_trajectory(rng, i, rng.randint(1, 4), rng.randint(1, 8))
                                       for _ in range(k)]) if rng.random() < 0.7 else base)
    batch = _batch(*trajs)
    for i, t in enumerate(batch["groups"][0]["trajectories"]):  # advantage 100 * i + k names the segment
        t["advantage"] = 100.0 * i
        for k, seg in enumerate(t.get("segments") or ()):
            seg["advantage"] = 100.0 * i + k
    seqs = sequences_from_batch(batch)
    trained = {}
    for q in seqs:
        trained[int(q.advantage // 100)] = trained.get(int(q.advantage // 100), 0) + 1
    total = sum(len(q.inputs) for q in seqs)
    lengths: dict[int, list[int]] = {}
    for q in seqs:
        lengths.setdefault(int(q.advantage // 100), []).append(len(q.inputs))
    cost = {i: (len(ls) * max(ls) if mode == "pad" else sum(ls)) for i, ls in lengths.items()}
    longest_unit = max(cost.values())
    for budget in sorted({1, 2, 5, 8, longest_unit - 1, longest_unit, longest_unit + 1, total - 1, total, total + 1}):
        if budget < 1:
            continue
        mbs = pack_batch(copy.deepcopy(batch), budget, mode)
        seen, shares = 0, {}
        for mb in mbs:
            here = {}
            for a in mb.advantages.tolist():
                here[int(a // 100)] = here.get(int(a // 100), 0) + 1
            for i in here:  # all of a trajectory that fits, or none of it
                assert here[i] == trained[i] or cost[i] > budget, (budget, mode, i)
            n = mb.advantages.shape[0]
            used = mb.input_ids.numel() if mode == "pad" else mb.input_ids.shape[1]
            assert n == 1 or used <= budget, (budget, mode, used)
            c = mb.seq_shares if mb.seq_shares is not None else torch.ones(n)
            for a, share in zip(mb.advantages.tolist(), c.tolist(), strict=True):
                shares[int(a // 100)] = shares.get(int(a // 100), 0.0) + share
            seen += n
        assert seen == len(seqs)
        assert all(v == pytest.approx(1.0, abs=1e-6) for v in shares.values()), (budget, mode, shares)


def _loop_loss(model, trajs: list[dict], mode: str, agg: str) -> torch.Tensor:
    """The intended loss at ratio 1, written out: every trained sequence s has advantage a_s, numerator
    weight w_s -- 1 unsegmented, 1 for a `divide` trajectory's segments (A / K each: divided once, in the
    advantages), 1/K for `broadcast` / `discount` (the per-rollout mean) -- and denominator share c_s (1/K
    for each of K segments: a trajectory counts once); token-mean sum_s w_s sum_t -a_s logp_st / sum_s c_s n_s,
    seq-mean-token-mean sum_s w_s mean_t(-a_s logp_st) / sum_s c_s."""
    rows = []
    for t in trajs:
        parts = t.get("segments") or [t]
        k = len(parts)
        w = 1.0 if t.get("segments") is None or mode == "divide" else 1.0 / k
        rows += [(p, w, 1.0 / k) for p in parts]
    num, den = 0.0, 0.0
    for p, w, c in rows:
        ids = torch.tensor([p["token_ids"]])
        logp = torch.log_softmax(model(ids[:, :-1]).logits.float(), -1).gather(-1, ids[:, 1:, None])[0, :, 0]
        m = torch.tensor(p["loss_mask"][1:], dtype=torch.float32)
        tok = -p["advantage"] * logp * m  # (T,)
        if agg == "token-mean":
            num, den = num + w * tok.sum(), den + c * float(m.sum())
        else:
            num, den = num + w * tok.sum() / m.sum(), den + c
    return num / den


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("mode", ["broadcast", "divide", "discount"])
@pytest.mark.parametrize("k", [1, 4])
def test_each_segment_advantage_mode_divides_by_k_once_against_a_loop(agg, mode, k):
    """Real tiny Qwen2, one SGD step (lr 1, no clipping, no TIS): the update is minus the gradient of the
    loop's loss, for segments that are distinct sequences with their mode's advantages."""
    from filters.segments import segment_advantages

    rng = random.Random(k)
    whole = make_trajectory(rng, 0, 3, 5)
    whole["advantage"] = 0.8
    segs = [make_trajectory(rng, 0, 2 + j, 3 + j) for j in range(k)]
    seg = _segmented(whole, segs, mode)
    for s, a in zip(seg["segments"], segment_advantages(0.8, k, mode, 0.5), strict=True):
        s["advantage"] = a
    other = make_trajectory(rng, 1, 4, 5)
    other["advantage"] = -0.5
    ref_model = tiny_model()
    _loop_loss(ref_model, [seg, other], mode, agg).backward()
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = StepConfig(loss=LossConfig(agg=agg, tis_cap=None), max_grad_norm=None)
    train_step(PolicyLogprobs(model, 6), torch.optim.SGD(model.parameters(), lr=1.0), pack_batch(_batch(seg, other),
                                                                                                    10_000), cfg)
    for (name, p), ref_p in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        step = p.detach() - before[name]
        torch.testing.assert_close(step, -ref_p.grad, atol=2e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("mode", ["broadcast", "divide"])
def test_a_ten_segment_trajectory_trains_with_the_gradient_of_the_same_reward_unsegmented(agg, mode):
    """The review's measure (/tmp/rev/d1.py): next to an unsegmented trajectory of advantage 1, ten segments
    of a trajectory of advantage 1 get the same total |gradient| on their log-probs (divide gave 1/10)."""
    from filters.segments import segment_advantages

    rng = random.Random(0)
    one = make_trajectory(rng, 0, 2, 4)
    ten = _segmented({**one, "advantage": 1.0}, [one] * 10, mode)
    for s, a in zip(ten["segments"], segment_advantages(1.0, 10, mode), strict=True):
        s["advantage"] = a
    seqs = sequences_from_batch(_batch(ten, {**one, "advantage": 1.0}))
    weights = torch.tensor([s.weight for s in seqs], dtype=torch.float64)  # (11,)
    shares = torch.tensor([s.share for s in seqs], dtype=torch.float64)  # (11,)
    adv = torch.tensor([s.advantage for s in seqs], dtype=torch.float64)[:, None]  # (11, 1)
    mask = torch.tensor([s.loss_mask for s in seqs], dtype=torch.float64)  # (11, T)
    logp = torch.zeros_like(mask, requires_grad=True)
    aggregate(-(adv * logp), mask, agg, segments=Segments(weights, shares)).backward()
    segmented, unsegmented = float(logp.grad[:10].abs().sum()), float(logp.grad[10].abs().sum())
    assert segmented == pytest.approx(unsegmented, rel=1e-9)


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("k", [2, 5])
def test_divide_trains_exactly_as_broadcast_next_to_other_trajectories(agg, k):
    """Real tiny Qwen2, one SGD step: a trajectory of K distinct segments with `divide`'s shares A / K gives
    the same update as with `broadcast`'s copies A -- the model's whole update, so the other trajectories'
    gradients too (divide's segments once took K tokens' room in the denominator under token-mean and
    trained at 1/K beside them) -- and both differ from treating the segments as K trajectories."""
    from filters.segments import segment_advantages

    rng = random.Random(k)
    whole = {**make_trajectory(rng, 0, 3, 5), "advantage": 0.8}
    segs = [make_trajectory(rng, 0, 2 + j, 3 + j) for j in range(k)]
    other = {**make_trajectory(rng, 1, 4, 5), "advantage": -0.5}
    updates = {}
    for mode in ("broadcast", "divide"):
        seg = _segmented(whole, segs, mode)
        for s, a in zip(seg["segments"], segment_advantages(0.8, k, mode), strict=True):
            s["advantage"] = a
        updates[mode] = _step(_batch(seg, other), agg)
    assert _max_diff(updates["broadcast"], updates["divide"]) < 2e-6
    apart = _step(_batch(*[{**s, "advantage": 0.8} for s in segs], other), agg)  # K trajectories
    assert _max_diff(updates["broadcast"], apart) > 1e-4

"""Segment advantages (filters.segments) against a plain loop, in both curation paths, over random groups."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from filters.curate import curate_group, curate_groups
from filters.policy import CurationPolicySpec
from filters.segments import guess_segment_advantage, segment_advantages, segment_weight
from filters.types import CurationPolicy, GroupScore, TrajectoryScore
from tests.filters.test_filters_batched import assert_same

GAMMAS = [1e-9, 0.1, 0.5, 0.9, 0.999999, 1.0]


def loop_reference(advantage: float, k: int, mode: str, gamma: float) -> list[float]:
    """Segment j of k, written out: broadcast A; divide A / k; discount A times gamma once per segment
    that follows it."""
    out = []
    for j in range(k):
        if mode == "broadcast":
            out.append(advantage)
        elif mode == "divide":
            out.append(advantage / k)
        else:
            value = advantage
            for _ in range(k - 1 - j):
                value *= gamma
            out.append(value)
    return out


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("mode", ["broadcast", "divide", "discount"])
@pytest.mark.parametrize("k", range(1, 11))
def test_segment_advantages_match_the_loop(k, mode, gamma):
    for a in (-1.7, 0.0, 0.3, 2.0):
        got = segment_advantages(a, k, mode, gamma)
        assert list(got) == pytest.approx(loop_reference(a, k, mode, gamma), rel=1e-12, abs=0)
    if mode == "discount":
        assert segment_advantages(2.0, k, mode, gamma)[-1] == 2.0  # the last segment gets A itself


def test_bad_options_are_refused():
    for gamma in (0.0, -0.1, 1.0000001, float("nan")):
        with pytest.raises(ValueError, match="segment_discount"):
            segment_advantages(1.0, 3, "discount", gamma)
        with pytest.raises(ValueError, match="segment_discount"):
            CurationPolicySpec(name="x", segment_discount=gamma)
    with pytest.raises(ValueError, match="segment_advantage"):
        CurationPolicy(segment_advantage="sum")
    with pytest.raises(ValueError, match="segment_advantage"):
        CurationPolicySpec(name="x", segment_advantage="sum")
    assert segment_advantages(1.0, 0, "divide") == ()


def _random_group(rng: random.Random, gid: int) -> GroupScore:
    trajs = []
    for i in range(rng.randint(1, 8)):
        trajs.append(TrajectoryScore(
            index=i, finish_reason=rng.choice(["stop", "stop", "stop", "length", "tool_misuse", "env_error"]),
            total=rng.choice([0.0, 0.5, 1.0, None] if rng.random() < 0.1 else [0.0, 0.5, 1.0]),
            components={}, outcome=None, num_tokens=rng.choice([0, 10, 900]),
            segments=rng.choice([0, 0, *range(1, 11)]),
        ))
    return GroupScore(group_id=f"g{gid}", policy_version=rng.randint(0, 3), trajectories=trajs, max_tokens=1000)


@pytest.mark.parametrize("mode", ["broadcast", "divide", "discount"])
@pytest.mark.parametrize("seed", range(5))
def test_both_curation_paths_assign_segments_from_the_trajectory_advantage(mode, seed):
    """Random groups, K = 0..10 segments a member: each segmented member's segment advantages are the
    loop's from its (group-relative) advantage, identical in the per-group and the vectorised path."""
    rng = random.Random(seed)
    gamma = rng.choice(GAMMAS)
    policy = CurationPolicy(segment_advantage=mode, segment_discount=gamma, max_staleness=1)
    groups = [_random_group(rng, g) for g in range(30)]
    batched = curate_groups(groups, policy, 3)
    for g, b in zip(groups, batched, strict=True):
        assert_same(b, curate_group(g, policy, 3))
        for t, d in zip(g.trajectories, b.trajectories, strict=True):
            assert len(d.segment_advantages) == t.segments
            assert list(d.segment_advantages) == pytest.approx(loop_reference(d.advantage, t.segments, mode, gamma))


def test_segmenting_a_member_does_not_change_any_trajectory_advantage():
    """Advantages come from the final rewards only: the same group with or without segments."""
    rng = random.Random(7)
    policy = CurationPolicy(segment_advantage="divide")
    for g in range(50):
        group = _random_group(rng, g)
        plain = GroupScore(group.group_id, group.policy_version,
                           [TrajectoryScore(**{**t.__dict__, "segments": 0}) for t in group.trajectories], 1000)
        a = [d.advantage for d in curate_group(group, policy, None).trajectories]
        b = [d.advantage for d in curate_group(plain, policy, None).trajectories]
        assert a == b


def test_divide_uses_the_trained_segments_as_k_in_both_paths():
    """`divide`'s K is the segments the trainer trains on (the K it averages over): a member with 4 segments of
    which 2 are trained gives every segment A / 2, in the per-group and the vectorised path alike."""
    assert segment_advantages(0.8, 4, "divide", trained=2) == pytest.approx((0.4,) * 4)
    assert segment_advantages(0.8, 3, "divide", trained=None) == pytest.approx((0.8 / 3,) * 3)
    assert segment_advantages(0.8, 3, "divide", trained=0) == pytest.approx((0.8 / 3,) * 3)  # nothing trained
    assert segment_advantages(0.8, 2, "broadcast", trained=1) == (0.8, 0.8)
    with pytest.raises(ValueError, match="0 to 2"):
        segment_advantages(0.8, 2, "divide", trained=3)
    trajs = [TrajectoryScore(index=0, finish_reason="stop", total=1.0, components={}, outcome=None, segments=4,
                             trained_segments=2),
             TrajectoryScore(index=1, finish_reason="stop", total=0.0, components={}, outcome=None)]
    group = GroupScore("g", 0, trajs, 1000)
    policy = CurationPolicy(segment_advantage="divide")
    plain, [batched] = curate_group(group, policy, None), curate_groups([group], policy, None)
    assert_same(batched, plain)
    a = plain.trajectories[0].advantage
    assert a > 0 and plain.trajectories[0].segment_advantages == pytest.approx((a / 2,) * 4)


@pytest.mark.parametrize("mode", ["broadcast", "divide", "discount"])
@pytest.mark.parametrize("k", [1, 2, 3, 10, 256])
def test_the_trainer_divides_by_k_once(mode, k):
    """segment_weight: 1 for divide (its advantages already A / K), 1/K for broadcast and discount (the
    per-rollout mean); K = 1 is 1 either way. A loop over the trained shares: they weigh A once in all."""
    w = segment_weight(mode, k)
    assert w == (1.0 if mode == "divide" else 1.0 / k)
    shares = segment_advantages(0.8, k, mode, 1.0)  # gamma 1: discount's shares equal broadcast's
    assert math.fsum(w * a for a in shares) == pytest.approx(0.8, rel=1e-12)


def test_segment_weight_refuses_an_unknown_mode_and_no_trained_segment():
    with pytest.raises(ValueError, match="broadcast, divide, discount"):
        segment_weight("sum", 2)
    with pytest.raises(ValueError, match="at least one"):
        segment_weight("divide", 0)


GOLDEN = (math.sqrt(5) - 1) / 2  # gamma + gamma^2 = 1


@pytest.mark.parametrize(("shares", "guessed"), [
    (segment_advantages(0.8, 3, "divide"), "divide"),
    (segment_advantages(0.8, 3, "broadcast"), "broadcast"),
    (segment_advantages(0.8, 3, "discount", 0.5), "broadcast"),
    (segment_advantages(0.8, 2, "discount", GOLDEN), "broadcast"),  # A gamma + A: not A
    (segment_advantages(0.8, 3, "discount", GOLDEN)[:2], "divide"),  # A gamma^2 + A gamma = A: taken for divide
])
def test_the_guess_is_only_a_guess(shares, guessed):
    """guess_segment_advantage (a batch without segment_advantage) reads divide off advantages that sum to
    A, so a discount trajectory whose trained segments sum to A (golden gamma, untrained last segment) is
    mistaken for divide: why the service sends the mode. float32 shares still sum to A."""
    got = guess_segment_advantage(float(np.float32(0.8)), [float(np.float32(x)) for x in shares])
    assert got == guessed
    assert guess_segment_advantage(0.0, [0.0, 0.0]) == "broadcast"  # A = 0: no gradient, cannot be told

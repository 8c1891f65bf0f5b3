"""DAPO soft overlong penalty: the three regions, the buffer forms, scalar == vectorised."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters import CurationPolicy, GroupScore, TrajectoryScore, ZeroVariance, curate_group, curate_groups
from filters.overlong import overlong_buffer_tokens, soft_overlong_penalties, soft_overlong_penalty
from rollout.episodes import _Episode
from rollout.sampler import Completion
from service.ingest.schemas import TrajectoryIn


@pytest.mark.parametrize(
    ("num_tokens", "expected"),
    [(0, 0.0), (800, 0.0), (801, -0.005), (900, -0.5), (1000, -1.0), (1001, -1.0), (5000, -1.0)],
)
def test_regions(num_tokens: int, expected: float) -> None:
    # L_max = 1000, L_cache = 200: no penalty up to 800, linear to -1 at 1000, -1 beyond
    assert soft_overlong_penalty(num_tokens, 1000, 200) == pytest.approx(expected)


def test_zero_buffer_is_a_hard_cutoff_that_punishes_at_the_budget() -> None:
    # a sampler capped at 1000 never returns 1001: a cut response has exactly the budget, and gets -1
    assert soft_overlong_penalty(999, 1000, 0) == 0.0
    assert soft_overlong_penalty(1000, 1000, 0) == -1.0
    assert soft_overlong_penalty(1001, 1000, 0) == -1.0


def test_buffer_larger_than_budget_is_clamped() -> None:
    assert soft_overlong_penalty(500, 1000, 5000) == pytest.approx(-0.5)


def test_buffer_fraction_or_tokens() -> None:
    assert overlong_buffer_tokens(0.2, 1024) == 204
    assert overlong_buffer_tokens(256, 1024) == 256
    assert overlong_buffer_tokens(4096, 1024) == 1024
    assert overlong_buffer_tokens(0.0, 1024) == 0
    # a positive fraction of a tiny budget is still one token, so a response cut at the budget is penalised
    assert overlong_buffer_tokens(0.2, 3) == 1
    assert soft_overlong_penalty(3, 3, overlong_buffer_tokens(0.2, 3)) == -1.0
    with pytest.raises(ValueError):
        overlong_buffer_tokens(-0.1, 1024)


def test_max_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        soft_overlong_penalty(10, 0, 0)
    with pytest.raises(ValueError, match="max_tokens"):
        soft_overlong_penalties(np.array([10]), np.array([0]), np.array([0]))


@settings(max_examples=200, deadline=None)
@given(
    cases=st.lists(
        st.tuples(st.integers(0, 3000), st.integers(1, 2000), st.integers(0, 2500)), min_size=1, max_size=20
    )
)
def test_vectorised_matches_scalar(cases: list[tuple[int, int, int]]) -> None:
    n, m, b = (np.array(c) for c in zip(*cases, strict=True))
    got = soft_overlong_penalties(n, m, b)
    expected = [soft_overlong_penalty(*c) for c in cases]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert ((got <= 0) & (got >= -1)).all()


# -- 4. soft_overlong judges a multi-turn episode's total by a per-turn budget ------------------------


def _two_turn_episode(turn_tokens: int) -> dict:
    """What rollout.episodes.multi_turn builds for: turn 1 calls a tool (stop), the tool answers, turn 2
    answers (stop); each turn sampled with the per-turn budget."""
    ep = _Episode([1, 5, 6])
    first = Completion([10] * (turn_tokens - 1) + [2], [-0.1] * turn_tokens, "stop")
    ep.model_turn(first, "<call>calc(1+1)</call>", None, 0)
    ep.observation([7, 7], "2", 0)
    second = Completion([11] * (turn_tokens - 1) + [2], [-0.1] * turn_tokens, "stop")
    ep.model_turn(second, "b", None, 1)
    return ep.done("stop")


# Attack: soft_overlong compared a multi-turn episode's total tokens with the per-turn budget and punished tool use.
def test_soft_overlong_does_not_punish_a_multi_turn_episode_whose_turns_all_fit():
    """The producer samples every turn of a multi-turn episode with `max_tokens` and posts that per-turn
    budget as the group's sampling.max_tokens; the service's num_tokens is the episode's loss-mask sum
    over all turns. With soft_overlong, an episode of two 10-token turns under a 16-token per-turn budget
    (no turn came near its budget) counts as 20 > 16 tokens and gets the full -1, the same as a response
    cut off by the budget -- so the shaping teaches the policy to stop calling tools."""
    budget, turn = 16, 10
    episodes = [_two_turn_episode(turn), _two_turn_episode(turn)]
    trajs = [
        TrajectoryScore(i, "stop", float(i), {}, float(i), TrajectoryIn(**e).response_tokens())
        for i, e in enumerate(episodes)
    ]
    assert [t.num_tokens for t in trajs] == [2 * turn, 2 * turn]
    group = GroupScore("mt", 0, trajs, max_tokens=budget)
    policy = CurationPolicy(zero_variance=ZeroVariance(action="keep"), min_group_size=1, soft_overlong=True)
    for decision in (curate_group(group, policy, None), curate_groups([group], policy, None)[0]):
        used = [d.reward_used for d in decision.trajectories]
        assert used == [t.total for t in trajs], f"every turn fit its budget, yet reward_used = {used}"

"""The trainer's logged staleness is measured from each leased group's oldest generated token, as the
service measures it (attack on the truncation remedies: a group whose member an older policy filled was
logged at its posting version, younger than it is)."""

from __future__ import annotations

import pytest
import torch

from trainer.worker import batch_stats


def _group(policy_version: int, *members: list[int] | None, segmented: list[int] | None = None) -> dict:
    trajectories = [{"versions": v, "total_reward": 1.0} for v in members]
    if segmented is not None:
        trajectories.append({"versions": None, "total_reward": 0.0,
                             "segments": [{"versions": segmented[:2]}, {"versions": segmented[2:]}]})
    return {"policy_version": policy_version, "trajectories": trajectories}


@pytest.mark.parametrize(("group", "oldest"), [
    (_group(5, None, None), 5),  # no per-token versions: the group's own
    (_group(5, [-1, 5, 5], None), 5),  # prompt tokens (-1) do not count
    (_group(5, [-1, 5, 5], [-1, 2, 3]), 2),  # a member filled by policy 2
    (_group(5, None, segmented=[-1, 4, -1, 1]), 1),  # a segment's tokens count too
    (_group(0, [-1, 0]), 0),
])
def test_staleness_is_measured_from_the_oldest_token(group, oldest):
    stats = batch_stats({"groups": [group]}, trained_version=7, device=torch.device("cpu"))
    assert stats["staleness_max"] == stats["staleness_mean"] == 7 - oldest
    two = batch_stats({"groups": [group, _group(7, None)]}, trained_version=7, device=torch.device("cpu"))
    assert two["staleness_mean"] == pytest.approx((7 - oldest) / 2) and two["staleness_max"] == 7 - oldest

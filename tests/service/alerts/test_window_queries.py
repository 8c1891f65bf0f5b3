"""The monitors' window reads at the size a real store reaches: a window of more groups than PostgreSQL
takes bind parameters (65,535) is read with one array parameter, not one parameter per group (found by
bench/monitor_cost.py: at 1M stored trajectories, 125k groups in the window, every evaluation failed)."""

from __future__ import annotations

from service.alerts import repository as repo


def test_a_window_of_more_groups_than_bind_parameters_is_read(session) -> None:
    pks = list(range(1, 70_001))  # no such groups in this database: the read must run and find nothing
    assert repo.window_trajectories(session, pks, 100) == []
    assert repo.window_rewards(session, pks) == []

"""The monitors' window reads and the evaluation cursor. At the size a real store reaches: a window of more
groups than PostgreSQL takes bind parameters (65,535) is read with one array parameter, not one parameter per
group (found by bench/monitor_cost.py: at 1M stored trajectories, 125k groups in the window, every evaluation
failed). The statements an evaluation saves (the newest version read with the metrics, the cursor moved by
one upsert, a spec body read only when it is new) answer as the ones they replaced did."""

from __future__ import annotations

from sqlalchemy import text

from service.alerts import inputs
from service.alerts import repository as repo
from service.store.models import AlertCursor, PolicyState
from tests.service.alerts.helpers import group, publish, setup_spec


def test_a_window_of_more_groups_than_bind_parameters_is_read(session) -> None:
    pks = list(range(1, 70_001))  # no such groups in this database: the read must run and find nothing
    assert repo.window_trajectories(session, pks, 100) == []
    assert repo.window_rewards(session, pks) == []


def test_the_window_ends_at_the_newest_published_version_read_with_its_metrics(session) -> None:
    assert repo.window_metrics(session, 3) == (0, {})  # none published: version 0, no metrics
    session.add_all([PolicyState(version=v, metrics={"entropy": v / 10}) for v in (1, 2, 4, 5)])  # no 3
    session.flush()
    assert repo.window_metrics(session, 3) == (5, {4: {"entropy": 0.4}, 5: {"entropy": 0.5}})
    assert repo.window_metrics(session, 50) == (5, {v: {"entropy": v / 10} for v in (1, 2, 4, 5)})


def test_the_cursor_answers_as_it_moves(session) -> None:
    """``scored_since`` at each as_of, after the ones before: never evaluated (None); the version last
    evaluated; the same version again answers what it answered then; an older version answers the cursor's
    own and leaves it there. ``peek_scored_since`` answers the same without moving it. Neither reads an ORM
    object the session holds (the cursor moves by an upsert that such an object would not see)."""
    held, answers = [], []
    for as_of in (4, 4, 7, 7, 9, 5, 9, 10):
        held.append(session.get(AlertCursor, "evaluate"))
        answers.append((as_of, repo.peek_scored_since(session, as_of), repo.scored_since(session, as_of)))
    assert answers == [(4, None, None), (4, None, None), (7, 4, 4), (7, 4, 4), (9, 7, 7), (5, 9, 9), (9, 7, 7),
                       (10, 9, 9)]
    session.expire_all()
    cursor = session.get(AlertCursor, "evaluate")
    assert (cursor.version, cursor.since) == (10, 9)


def test_a_spec_body_is_read_once_while_it_stays_the_same(client, session, monkeypatch) -> None:
    """The window's groups carry a digest of their spec version's stored body: the same body is not read
    again; another body under the same name and version (a database copied from another, say) is; a spec
    version with no stored row is read (and warned about) each time."""
    setup_spec(client)
    publish(client, 1, entropy=1.0)
    assert client.post("/v1/groups", json=group("g-1", 1, ["42", "7"])).status_code == 201
    assert client.post("/v1/groups", json=group("g-2", 1, ["42", "7"])).status_code == 201
    session.execute(text("UPDATE groups SET reward_spec_name = 'mon', reward_spec_version = 1 WHERE id = 'g-1'"))
    session.execute(text("UPDATE groups SET reward_spec_name = 'gone', reward_spec_version = 9 WHERE id = 'g-2'"))
    reads, real = [], inputs._spec_components
    monkeypatch.setattr(inputs, "_spec_components", lambda s, name, v: reads.append(name) or real(s, name, v))
    monkeypatch.setattr(inputs, "_spec_cache", [{}])
    mon = {"correct": (1.0, True), "fmt": (0.1, False)}
    assert inputs.read_window(session, 50).specs == {("mon", 1): mon, ("gone", 9): None}
    assert inputs.read_window(session, 50).specs == {("mon", 1): mon, ("gone", 9): None}
    assert sorted(reads) == ["gone", "gone", "mon"]
    session.execute(text("UPDATE reward_specs SET body = jsonb_set(body, '{components,1,weight}', '0.5') "
                         "WHERE name = 'mon'"))
    assert inputs.read_window(session, 50).specs[("mon", 1)] == {"correct": (1.0, True), "fmt": (0.5, False)}
    assert sorted(reads) == ["gone", "gone", "gone", "mon", "mon"]

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


def _scored_with(client, session, specs: dict[str, tuple[str, int]]) -> None:
    """Groups g-<i> at version 1, each marked scored with the spec version given."""
    setup_spec(client)
    publish(client, 1, entropy=1.0)
    for gid, (name, version) in specs.items():
        assert client.post("/v1/groups", json=group(gid, 1, ["42", "7"])).status_code == 201
        session.execute(text("UPDATE groups SET reward_spec_name = :n, reward_spec_version = :v WHERE id = :id"),
                        {"n": name, "v": version, "id": gid})


_SET_WEIGHT = "UPDATE reward_specs SET body = jsonb_set(body, '{components,1,weight}', :w) WHERE name = 'mon'"


def test_a_spec_body_is_read_once_while_it_stays_the_same(client, session, monkeypatch) -> None:
    """The digests of the window's spec versions are read each time and a body only when its digest is new: the
    same body is not read again; another body under the same name and version (edited in place, or a
    database copied from another) is; a spec version with no stored row is asked for (and warned about) each
    time; a stored spec no group of the window used is never read."""
    _scored_with(client, session, {"g-1": ("mon", 1), "g-2": ("gone", 9)})
    reads, real = [], repo.spec_bodies
    monkeypatch.setattr(repo, "spec_bodies", lambda s, keys: reads.append(sorted(keys)) or real(s, keys))
    monkeypatch.setattr(inputs, "_spec_cache", [{}])
    mon = {"correct": (1.0, True), "fmt": (0.1, False)}
    assert inputs.read_window(session, 50).specs == {("mon", 1): mon, ("gone", 9): None}
    assert inputs.read_window(session, 50).specs == {("mon", 1): mon, ("gone", 9): None}
    assert reads == [[("gone", 9), ("mon", 1)], [("gone", 9)]]
    session.execute(text(_SET_WEIGHT), {"w": "0.5"})
    assert inputs.read_window(session, 50).specs[("mon", 1)] == {"correct": (1.0, True), "fmt": (0.5, False)}
    assert reads[-1] == [("gone", 9), ("mon", 1)]
    assert repo.spec_digests(session, {("mon", 1), ("gone", 9), ("unused", 1)}).keys() == {("mon", 1)}


def test_a_body_edited_between_the_digests_and_the_bodies_is_cached_under_its_own_digest(client, session,
                                                                                          monkeypatch) -> None:
    """The digests and the bodies are two statements: a body edited in between (another transaction's commit, READ
    COMMITTED) is cached under the digest read with it, so that once the edit is undone the stored body's
    weights are read again, not the edit's from the cache (found by an attack: the digest of the window's
    statement cached the edited body under the original's digest for good)."""
    _scored_with(client, session, {"g-1": ("mon", 1)})
    monkeypatch.setattr(inputs, "_spec_cache", [{}])
    real, edits = repo.spec_bodies, []

    def racing(s, keys):
        if not edits:
            edits.append(s.execute(text(_SET_WEIGHT), {"w": "0.5"}))
        return real(s, keys)

    monkeypatch.setattr(repo, "spec_bodies", racing)
    assert inputs.read_window(session, 50).specs[("mon", 1)]["fmt"] == (0.5, False)  # what the body said then
    session.execute(text(_SET_WEIGHT), {"w": "0.1"})  # the edit undone
    assert inputs.read_window(session, 50).specs[("mon", 1)]["fmt"] == (0.1, False)

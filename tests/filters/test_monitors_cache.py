"""``StatsCache``: ``summarize`` made incremental as the alert window slides. Over random sequences of
windows (new versions, groups added to or scored in old versions, versions leaving the window, facts rebuilt
as fresh objects each time as the service reads them) the cached result equals a full recomputation, and
only the versions whose groups changed are computed again."""

from __future__ import annotations

import random

import pytest

from filters import monitors as m
from filters.monitors import ComponentFact, GroupFact, StatsCache, TrajectoryFact

REASONS = ("stop", "length", "env_error", "stop", "stop")


def _trajectory(rng: random.Random, scored: bool) -> TrajectoryFact:
    outcome = rng.choice([0.0, 1.0, float("nan")]) if scored else None
    fmt = rng.choice([0.0, 1.0, None])
    comps = (ComponentFact("correct", "verifier.math", outcome, 1.0, True),
             ComponentFact("fmt", "rule.format", fmt, 0.1),
             ComponentFact("judge", "judge.llm", rng.random()))
    text = rng.choice(["", "the answer is " * 200, " ".join(str(rng.random()) for _ in range(80))])
    return TrajectoryFact(tokens=rng.randint(1, 200), finish_reason=rng.choice(REASONS), text=text,
                          outcome=outcome, total=None if not scored else rng.random(),
                          components=comps if scored else ())


def _group(rng: random.Random, version: int) -> dict:
    """A group as plain data (rebuilt into fresh facts for every window, as each evaluation reads them, in
    insertion (pk) order: a late group of an old version comes after newer ones)."""
    return {"version": version, "seed": rng.random(), "n": rng.randint(1, 4), "scored": rng.random() < 0.6,
            "zero_variance": rng.random() < 0.2, "stale": rng.random() < 0.1}


def _facts(rows: list[dict]) -> list[GroupFact]:
    out = []
    for r in rows:
        rng = random.Random(r["seed"])
        trajs = tuple(_trajectory(rng, r["scored"]) for _ in range(r["n"]))
        out.append(GroupFact(r["version"], trajs, r["scored"], r["zero_variance"], r["stale"]))
    return out


def _same(a: dict, b: dict) -> bool:
    return repr(a) == repr(b)  # NaN-aware: repr(nan) == 'nan'


@pytest.mark.parametrize("seed", range(20))
def test_incremental_summarize_equals_a_full_recomputation(seed, monkeypatch):
    rng = random.Random(seed)
    cache, rows, window = StatsCache(), [], rng.randint(3, 12)
    computed: list[int] = []
    plain = m._version_stats
    monkeypatch.setattr(m, "_version_stats", lambda v, gs: computed.append(v) or plain(v, gs))
    for version in range(1, 60):
        rows += [_group(rng, version) for _ in range(rng.randint(0, 3))]
        changed = {version}
        for _ in range(rng.randint(0, 2)):  # the worker scores an older group, or a late group arrives
            if rows and rng.random() < 0.5:
                r = rng.choice(rows)
                r["scored"] = True
            else:
                r = _group(rng, rng.randint(max(1, version - window), version))
                rows.append(r)
            changed.add(r["version"])
        rows = [r for r in rows if r["version"] > version - window]
        facts = _facts(rows)
        computed.clear()
        got = cache.summarize(facts)
        recomputed_by_cache = set(computed)
        assert _same(got, m.summarize(facts))
        assert list(got) == sorted(got)
        # incremental: a version is computed again only when its groups changed (or hold a NaN, which
        # equals nothing, itself included)
        nan_versions = {g.version for g in facts if any(t.outcome != t.outcome for t in g.trajectories)}
        assert recomputed_by_cache <= (changed | nan_versions) & set(got)


def test_a_version_whose_groups_change_is_computed_again():
    t = TrajectoryFact(tokens=10, finish_reason="stop", text="x", outcome=0.0, total=0.0)
    before = [GroupFact(1, (t, t), scored=False), GroupFact(2, (t,), scored=True)]
    after = [GroupFact(1, (t, t), scored=True), GroupFact(2, (t,), scored=True)]  # version 1's group scored
    cache = StatsCache()
    assert cache.summarize(before) == m.summarize(before)
    assert cache.summarize(after) == m.summarize(after)
    assert cache.summarize(after)[1].zero_variance_share == 0.0  # read from the scored group, not the cache
    assert cache.summarize([]) == {}
    assert cache.summarize(before) == m.summarize(before)

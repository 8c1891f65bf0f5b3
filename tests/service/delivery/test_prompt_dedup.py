"""A group's shared prompt tokens are stored once (prompt_prefixes, migration 0016), and a lease -- JSON and
Arrow -- still returns every member's token_ids, loss_mask, logprobs and versions bit for bit as posted.

Real PostgreSQL, the real app in-process (every request commits); ``mark_ready`` stands in for curation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from service.app import create_app
from service.client import decode_arrow
from service.delivery.schemas import ARROW_MEDIA_TYPE
from service.ingest import service as ingest
from service.ingest.schemas import TrajectoryIn
from service.store import arrays
from tests.helpers import make_group, make_shared_prompt_group, make_trajectory, shared_prompt_member
from tests.service.delivery.helpers import mark_ready, reset

PV = 3  # the groups' policy version
DTYPES = {"token_ids": arrays.TOKEN_DTYPE, "loss_mask": arrays.MASK_DTYPE, "logprobs": arrays.LOGPROB_DTYPE,
          "versions": arrays.VERSION_DTYPE}


@pytest.fixture(scope="module")
def dedup_url(make_db) -> str:
    return make_db()


@pytest.fixture
def db(dedup_url: str) -> Iterator[Engine]:
    engine = create_engine(dedup_url)
    reset(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def api(dedup_url: str, db: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(database_url=dedup_url)) as c:
        yield c


def shared_group(gid: str) -> dict[str, Any]:
    return make_shared_prompt_group(gid, prompt_id=f"p-{gid}", policy_version=PV)


def _differ_inside(g: dict) -> None:  # member 2's token 20 differs: the prefix stops there
    g["trajectories"][2]["token_ids"][20] += 1


def _differ_early(g: dict) -> None:  # member 1's token 3 differs: under MIN_TOKENS, not stored apart
    g["trajectories"][1]["token_ids"][3] += 1


def _signed_zero(g: dict) -> None:  # member 3's prompt log-prob 30 is -0.0, the others' 0.0: not the same bytes
    g["trajectories"][3]["logprobs"][30] = -0.0


def _versions_differ(g: dict) -> None:  # member 0 says its prompt token 30 came from the model
    t = g["trajectories"][0]
    t["loss_mask"][30], t["versions"][30] = 1, PV


def _no_logprobs_or_versions(g: dict) -> None:
    for t in g["trajectories"]:
        del t["logprobs"], t["versions"]


def _some_without_logprobs(g: dict) -> None:  # an array some members carry and others do not: stored whole
    del g["trajectories"][1]["logprobs"]


def _one_member(g: dict) -> None:
    del g["trajectories"][1:]


def _segmented(g: dict) -> None:  # a segmented member: the group is stored whole
    t = g["trajectories"][0]
    t["segments"] = [{k: t.pop(k) for k in ("token_ids", "loss_mask", "logprobs")},
                     {k: v for k, v in make_trajectory(seed=9).items() if k in ("token_ids", "loss_mask", "logprobs")}]
    del t["versions"]


CASES = {  # name: (how the shared-prompt group is changed, the prefix_len stored)
    "shared": (None, 40),
    "differ_inside_prompt": (_differ_inside, 20),
    "differ_early": (_differ_early, 0),  # 3 < MIN_TOKENS
    "signed_zero_logprob": (_signed_zero, 30),
    "versions_differ": (_versions_differ, 30),
    "no_logprobs_or_versions": (_no_logprobs_or_versions, 40),
    "some_without_logprobs": (_some_without_logprobs, 0),
    "one_member": (_one_member, 0),
    "segments": (_segmented, 0),
    "no_shared_prompt": ("plain", 0),
}


def build(case: str, gid: str) -> dict[str, Any]:
    change, _ = CASES[case]
    if change == "plain":
        return make_group(gid, prompt_id=f"p-{gid}", n=4)  # each member its own random prompt
    g = shared_group(gid)
    if change is not None:
        change(g)
    return g


def stored_prefix(db: Engine, gid: str) -> tuple[list[int], int]:
    """Each member's prefix_len, and how many prompt_prefixes rows the group has."""
    with db.connect() as conn:
        lens = conn.execute(text("SELECT t.prefix_len FROM trajectories t JOIN groups g ON g.pk = t.group_pk"
                                 " WHERE g.id = :g ORDER BY t.idx"), {"g": gid}).scalars().all()
        rows = conn.execute(text("SELECT count(*) FROM prompt_prefixes p JOIN groups g ON g.pk = p.group_pk"
                                 " WHERE g.id = :g"), {"g": gid}).scalar_one()
    return list(lens), rows


def posted_bytes(t: dict[str, Any], name: str) -> bytes | None:
    """What the service was sent for one array of one trajectory (segments end to end), as stored bytes."""
    if t.get("segments") is not None:  # segments carry no versions
        return None if name == "versions" else b"".join(arrays.encode(s[name], DTYPES[name]) for s in t["segments"])
    return arrays.encode(t.get(name), DTYPES[name])


def leased_bytes(t: dict[str, Any], name: str) -> bytes | None:
    """One array of one leased trajectory (Arrow, numpy views) as bytes (segments end to end)."""
    if t.get("segments") is not None:
        if name == "versions":
            return t.get("versions")
        return b"".join(np.asarray(s[name], DTYPES[name]).tobytes() for s in t["segments"])
    return None if t.get(name) is None else np.asarray(t[name], DTYPES[name]).tobytes()


def assert_identical(posted: dict[str, Any], got: dict[str, Any], names: tuple[str, ...] = tuple(DTYPES)) -> None:
    for i, (p, t) in enumerate(zip(posted["trajectories"], got["trajectories"], strict=True)):
        for name in names:
            assert leased_bytes(t, name) == posted_bytes(p, name), (i, name)


@pytest.mark.parametrize("case", list(CASES))
def test_the_prompt_token_dedup_returns_identical_tokens_on_lease(api, db, case):
    """The shared prefix is stored once when it is worth it, and the lease returns every array bit for bit."""
    posted = build(case, f"g-{case}")
    assert api.post("/v1/groups", json={"groups": [posted]}).status_code == 201
    lens, rows = stored_prefix(db, posted["id"])
    want = CASES[case][1]
    assert lens == [want] * len(posted["trajectories"]) and rows == (1 if want else 0)
    mark_ready(db)
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10},
                 headers={"Accept": ARROW_MEDIA_TYPE})
    assert r.status_code == 200, r.text
    [got] = decode_arrow(r.content, as_numpy=True)["groups"]
    assert_identical(posted, got)
    # the JSON answer (another lease of the same group, after a nack) carries the same numbers
    assert api.post(f"/v1/batches/{r.headers['x-batch-id']}/nack", json={}).status_code in (200, 204)
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10})
    [as_json] = r.json()["groups"]
    assert_identical(posted, as_json)
    # and so does the group's own read (ORM objects: Trajectory.token_ids & co.)
    r = api.get(f"/v1/groups/{posted['id']}", params={"include_tokens": True})
    assert_identical(posted, r.json())


def test_a_replaced_member_is_stored_whole_and_the_others_keep_the_prefix(api, db):
    """A remedy's replacement (ingest.replace_trajectory) writes one member whole (prefix_len 0); the others
    still read through the group's prefix, and the lease returns both exactly."""
    posted = shared_group("g-replaced")
    assert api.post("/v1/groups", json={"groups": [posted]}).status_code == 201
    new = shared_prompt_member([7] * 50, [-0.5] * 50, seed=77, policy_version=PV)
    with Session(db) as session, session.begin():
        pk = session.execute(text("SELECT pk FROM groups WHERE id = 'g-replaced'")).scalar_one()
        ingest.replace_trajectory(session, pk, 1, TrajectoryIn.model_validate(new))
    posted["trajectories"][1] = new
    assert stored_prefix(db, "g-replaced") == ([40, 0, 40, 40], 1)
    mark_ready(db)
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10},
                 headers={"Accept": ARROW_MEDIA_TYPE})
    [got] = decode_arrow(r.content, as_numpy=True)["groups"]
    assert_identical(posted, got)


def test_the_stored_bytes_shrink_by_the_shared_prompt(api, db):
    """What the dedup saves, on the row sizes themselves: G members store their prompt once, not G times."""
    posted = make_shared_prompt_group("g-size", n=8, prompt_len=400)
    assert api.post("/v1/groups", json={"groups": [posted]}).status_code == 201
    with db.connect() as conn:
        stored = conn.execute(text(
            "SELECT sum(octet_length(t.token_ids) + octet_length(t.loss_mask) + octet_length(t.logprobs)"
            " + octet_length(t.versions)) FROM trajectories t JOIN groups g ON g.pk = t.group_pk"
            " WHERE g.id = 'g-size'")).scalar_one()
        shared = conn.execute(text(
            "SELECT octet_length(p.token_ids) + octet_length(p.loss_mask) + octet_length(p.logprobs)"
            " + octet_length(p.versions) FROM prompt_prefixes p JOIN groups g ON g.pk = p.group_pk"
            " WHERE g.id = 'g-size'")).scalar_one()
    whole = sum(len(posted_bytes(t, n) or b"") for t in posted["trajectories"] for n in DTYPES)
    assert shared == 400 * 13 and stored + shared == whole - 7 * 400 * 13

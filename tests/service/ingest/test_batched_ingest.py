"""POST /v1/groups stores a whole request with a fixed number of statements (issue 27: one multi-row INSERT of
the groups, one COPY of every member) and answers each group as one group at a time did; the token arrays are
validated at C speed with the per-item rule's errors; the idempotency hash is the model dump's."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import orjson
import pytest
from pydantic import Field, ValidationError
from sqlalchemy import Engine, event, func, select, text
from sqlalchemy.orm import Session

from service.api.validation import format_errors
from service.ingest import service as ingest
from service.ingest.schemas import (
    INT4_MAX,
    GroupIn,
    Int4,
    LogProb,
    MaskItem,
    SegmentIn,
    TrajectoryIn,
    VersionItem,
)
from service.store.models import Group, Prompt, Trajectory
from tests.helpers import make_group, make_shared_prompt_group


def counts(session: Session) -> tuple[int, int, int]:
    return tuple(session.scalar(select(func.count()).select_from(m)) for m in (Prompt, Group, Trajectory))  # type: ignore[return-value]


def test_a_batch_of_new_and_stored_groups_is_answered_group_by_group(client, session):
    assert client.post("/v1/groups", json=make_group("old", prompt_id="p-old")).status_code == 201
    body = {"groups": [make_group("new-0", prompt_id="p-0"), make_group("old", prompt_id="p-old"),
                       make_group("new-1", prompt_id="p-1")]}
    r = client.post("/v1/groups", json=body)
    assert r.status_code == 201, r.text
    assert [(a["id"], a["created"], a["status"]) for a in r.json()["groups"]] == [
        ("new-0", True, "received"), ("old", False, "received"), ("new-1", True, "received")]
    assert counts(session) == (3, 3, 12)
    again = client.post("/v1/groups", json=body)  # all stored: 200, each as stored
    assert again.status_code == 200 and [a["created"] for a in again.json()["groups"]] == [False] * 3
    assert counts(session) == (3, 3, 12)


def test_the_first_refusal_in_request_order_is_the_answer(client, session):
    """An earlier group's 409 comes before a later group's unknown prompt, and the other way round."""
    assert client.post("/v1/groups", json=make_group("taken", prompt_id="p-t")).status_code == 201
    conflict = make_group("taken", prompt_id="p-t", policy_version=7)
    unknown = make_group("nope", prompt_id="p-unknown", inline_prompt=False)
    r = client.post("/v1/groups", json={"groups": [make_group("fresh", prompt_id="p-f"), conflict, unknown]})
    assert r.status_code == 409 and r.json()["error"].startswith("groups[1].id:"), r.text
    r = client.post("/v1/groups", json={"groups": [make_group("fresh", prompt_id="p-f"), unknown, conflict]})
    assert r.status_code == 422 and r.json()["error"].startswith("groups[1].prompt_id:"), r.text
    assert counts(session) == (1, 1, 4)


def test_a_batch_is_a_fixed_number_of_statements(client, session):
    def statements(body: dict[str, Any]) -> int:
        seen: list[str] = []
        listener = lambda *args: seen.append(args[2])  # noqa: E731 -- (conn, cursor, statement, ...)
        event.listen(Engine, "before_cursor_execute", listener)  # every engine: the app's own too
        try:
            assert client.post("/v1/groups", json=body).status_code == 201
        finally:
            event.remove(Engine, "before_cursor_execute", listener)
        return len(seen)

    assert client.post("/v1/groups", json=make_shared_prompt_group("warm", prompt_id="p-w")).status_code == 201
    one = statements({"groups": [make_shared_prompt_group("s-0", prompt_id="p-s")]})
    many = statements({"groups": [make_shared_prompt_group(f"m-{i}", prompt_id="p-m", seed=i) for i in range(20)]})
    assert many == one


def test_shared_prompts_of_a_batch_come_back_exactly_as_posted(client, session):
    groups = [make_shared_prompt_group(f"sp-{i}", prompt_id=f"p-sp-{i % 2}", seed=i) for i in range(5)]
    groups.append(make_group("plain", prompt_id="p-plain"))  # no shared prefix worth a row: stored whole
    assert client.post("/v1/groups", json={"groups": groups}).status_code == 201
    assert session.scalar(text("SELECT count(*) FROM prompt_prefixes")) == 5
    for g in groups:
        got = client.get(f"/v1/groups/{g['id']}", params={"include_tokens": True}).json()["trajectories"]
        for posted, stored in zip(g["trajectories"], got, strict=True):
            for name in ("token_ids", "loss_mask", "versions"):
                assert stored[name] == posted.get(name)
            assert stored["logprobs"] == pytest.approx(posted["logprobs"], rel=1e-6)


def test_every_read_of_a_request_takes_more_ids_than_postgres_takes_parameters(client, session):
    """A request of 70,000 groups names 70,000 ids (and as many prompts) in each statement of the ingest path:
    one array parameter each, not one bind parameter per id (PostgreSQL refuses a statement of more than 65,535:
    a batch that large was a 500, helper-35 F1)."""
    from service.ingest import prompts_repository as prompt_repo
    from service.ingest import repository as group_repo

    for i in range(2):
        assert client.post("/v1/groups", json=make_group(f"big-{i}", prompt_id=f"pb-{i}")).status_code == 201
    ids, prompts = [f"big-{i}" for i in range(70_000)], [f"pb-{i}" for i in range(70_000)]
    assert sorted(group_repo.existing_groups(session, ids)) == ["big-0", "big-1"]
    assert group_repo.tombstones(session, ids) == {}
    assert sorted(group_repo.prompts_by_id(session, set(prompts))) == ["pb-0", "pb-1"]
    assert prompt_repo.lock_prompts_for_groups(session, prompts) == {"pb-0": "toy", "pb-1": "toy"}
    assert sorted(prompt_repo.stored_fields(session, prompts)) == ["pb-0", "pb-1"]
    pks = [row.pk for row in group_repo.existing_groups(session, ids).values()]
    group_repo.delete_groups(session, [*pks, *range(10**9, 10**9 + 70_000)])
    assert group_repo.existing_groups(session, ids) == {}


# -- the idempotency hash: the same as hashing the whole model dump (hashes stored before issue 27 still match)
def _dump_hash(group: GroupIn) -> str:
    dump = group.model_dump(mode="json")
    canonical = {k: ingest._canonical(v) for k, v in dump.items() if k != "trajectories"}
    canonical["trajectories"] = [ingest._canonical_trajectory(t) for t in dump["trajectories"]]
    return hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _varied_groups() -> list[dict[str, Any]]:
    plain = make_group("h-plain", metadata={"z": 1.0, "a": [1, 2.5, {"q": -0.0}]},
                       sampling={"temperature": 1, "max_tokens": 7, "x": {"b": 1, "a": 2}})
    ints = make_group("h-ints")
    for t in ints["trajectories"]:
        t["logprobs"] = [0] * len(t["token_ids"])  # integers where floats go
        t["metadata"] = {"k": 3.0, "j": [1.0, "x"]}
    segmented = make_group("h-seg")
    for t in segmented["trajectories"]:
        t["segments"] = [{k: t.pop(k) for k in ("token_ids", "loss_mask", "logprobs")},
                         {"token_ids": [5, 6], "loss_mask": [0, 1], "logprobs": [-0.5, -1],
                          "messages": [{"role": "assistant", "content": "x"}]}]
    bare = make_group("h-bare")
    for t in bare["trajectories"]:
        for k in ("token_ids", "loss_mask", "logprobs"):
            del t[k]
    return [plain, ints, segmented, bare, make_shared_prompt_group("h-shared")]


@pytest.mark.parametrize("doc", _varied_groups(), ids=lambda d: d["id"])
def test_body_hash_is_the_hash_of_the_whole_dump(doc):
    assert ingest.body_hash(GroupIn.model_validate(doc, strict=True)) == _dump_hash(GroupIn.model_validate(doc, strict=True))


# -- the token arrays: C-speed validation, the per-item rule's errors
class _ExactSegment(SegmentIn):
    token_ids: list[Int4] = Field(min_length=1)
    loss_mask: list[MaskItem]
    logprobs: list[LogProb] | None = None


class _Exact(TrajectoryIn):
    """TrajectoryIn with the per-item types only (what the fast path must answer exactly like)."""

    token_ids: list[Int4] | None = None
    loss_mask: list[MaskItem] | None = None
    logprobs: list[LogProb] | None = None
    versions: list[VersionItem] | None = None
    segments: list[_ExactSegment] | None = None


BAD = [True, False, 1.0, 0.5, -1, -2, 2, 2**31, INT4_MAX, "1", None, [1], {}, -1e5 - 1, 2e-3, float("nan"),
       float("inf"), -0.0, 0]


def _errors(model: type, doc: dict[str, Any]) -> Any:
    try:
        model.model_validate(doc, strict=True)
    except ValidationError as exc:
        return format_errors(exc.errors(include_url=False))
    return "valid"


def _cases() -> list[tuple[str, dict[str, Any]]]:
    base = make_group("v")["trajectories"][1]
    base["versions"] = [-1 if m == 0 else 0 for m in base["loss_mask"]]
    cases = []
    for field in ("token_ids", "loss_mask", "logprobs", "versions"):
        for v in BAD:
            t = copy.deepcopy(base)
            t[field][2] = v
            cases.append((f"{field}[2]={v!r}", t))
            t = copy.deepcopy(t)
            t[field][0] = v
            t["token_ids"][4] = -3  # several errors in several fields
            cases.append((f"{field}[0,2]={v!r}+token", t))
        for whole in ([], None, "x", 5, [[1]]):
            t = copy.deepcopy(base)
            t[field] = whole
            cases.append((f"{field}={whole!r}", t))
        if field != "versions":
            seg = copy.deepcopy(base)
            del seg["versions"]
            seg["segments"] = [{k: seg.pop(k) for k in ("token_ids", "loss_mask", "logprobs")}]
            for v in [*BAD[:12], []]:
                t = copy.deepcopy(seg)
                if v == []:
                    t["segments"][0][field] = v
                else:
                    t["segments"][0][field][1] = v
                cases.append((f"segments[0].{field}[1]={v!r}", t))
    return cases


@pytest.mark.parametrize(("name", "doc"), _cases(), ids=[c[0] for c in _cases()])
def test_token_arrays_are_refused_with_the_per_item_errors(name, doc):
    assert _errors(TrajectoryIn, doc) == _errors(_Exact, doc)

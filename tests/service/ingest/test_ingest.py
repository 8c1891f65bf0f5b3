"""POST /v1/prompts, POST /v1/groups, GET /v1/groups[/{id}] against a real PostgreSQL."""

from __future__ import annotations

import copy

import orjson
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.store.models import Group, Prompt, Trajectory
from tests.helpers import make_group, make_trajectory, tool_episode


def counts(session: Session) -> tuple[int, int, int]:
    return tuple(session.scalar(select(func.count()).select_from(m)) for m in (Prompt, Group, Trajectory))  # type: ignore[return-value]


class TestRoundTrip:
    def test_multi_turn_tool_trajectory_round_trips(self, client, session):
        group = make_group("rt-1", n=2)
        group["trajectories"][1] = tool_episode()
        r = client.post("/v1/groups", json=group)
        assert r.status_code == 201, r.text
        assert r.json() == {"id": "rt-1", "status": "received", "trajectories": 2, "created": True}

        got = client.get("/v1/groups/rt-1", params={"include_tokens": True}).json()
        assert got["status"] == "received" and got["dataset"] == "toy" and got["policy_version"] == 0
        t = got["trajectories"][1]
        sent = tool_episode()
        assert t["index"] == 1
        assert t["token_ids"] == sent["token_ids"]
        assert t["loss_mask"] == sent["loss_mask"]
        assert t["logprobs"] == sent["logprobs"]  # exactly representable in float32
        assert t["messages"][0]["tool_calls"][0]["function"]["name"] == "calc"
        assert t["messages"][1] == {"role": "tool", "content": "42", "tool_call_id": "c1", "tool_calls": []}
        assert t["final_answer"] == "The answer is 42."  # defaults to the last assistant message
        assert t["num_turns"] == 2 and t["num_tokens"] == 4  # model-generated tokens from the mask
        assert t["metadata"] == {"env": "calc-v1"}
        assert t["total_reward"] is None and t["advantage"] is None

    def test_prompts_endpoint_then_group_without_inline_prompt(self, client):
        r = client.post(
            "/v1/prompts",
            json={"prompts": [{"id": "gsm-1", "dataset": "gsm8k", "messages": [{"role": "user", "content": "1+1?"}],
                               "reference": {"answer": "2"}, "metadata": {"split": "train"}}]},
        )
        assert r.status_code == 200 and r.json() == {"upserted": 1}
        r = client.post("/v1/groups", json=make_group("g-no-inline", prompt_id="gsm-1", inline_prompt=False))
        assert r.status_code == 201
        assert client.get("/v1/groups/g-no-inline").json()["dataset"] == "gsm8k"

    def test_batch_of_groups(self, client, session):
        body = {"groups": [make_group(f"b-{i}", prompt_id=f"bp-{i}") for i in range(3)]}
        r = client.post("/v1/groups", json=body)
        assert r.status_code == 201
        assert [g["id"] for g in r.json()["groups"]] == ["b-0", "b-1", "b-2"]
        assert counts(session) == (3, 3, 12)


class TestIdempotency:
    def test_same_id_same_body_is_200_with_same_answer(self, client, session):
        group = make_group("idem-1")
        first = client.post("/v1/groups", json=group)
        again = client.post("/v1/groups", content=orjson.dumps(group, option=orjson.OPT_INDENT_2), headers={"content-type": "application/json"})
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json() | {"created": True} == first.json()
        assert counts(session) == (1, 1, 4)

    def test_same_id_different_body_is_409_and_nothing_changes(self, client, session):
        client.post("/v1/groups", json=make_group("conf-1"))
        before = client.get("/v1/groups/conf-1", params={"include_tokens": True}).json()
        other = make_group("conf-1", answers=["41", "42", "43", "44"])
        r = client.post("/v1/groups", json=other)
        assert r.status_code == 409
        assert "id" in r.json()["error"] and "conf-1" in r.json()["error"]
        assert client.get("/v1/groups/conf-1", params={"include_tokens": True}).json() == before
        assert counts(session) == (1, 1, 4)

    def test_conflict_inside_a_batch_stores_nothing_of_the_batch(self, client, session):
        client.post("/v1/groups", json=make_group("batch-old"))
        body = {"groups": [make_group("batch-new", prompt_id="p-new"), make_group("batch-old", policy_version=9)]}
        r = client.post("/v1/groups", json=body)
        assert r.status_code == 409 and "groups[1].id" in r.json()["error"]
        assert counts(session) == (1, 1, 4)


def _bad(**mutations):
    group = make_group("bad-1")
    for path, value in mutations.items():
        target = group
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if k.isdigit() else target[k]
        last = keys[-1]
        if value is _DELETE:
            del target[last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return group


_DELETE = object()

BAD_GROUPS = {
    "unequal_mask": (_bad(trajectories__0__loss_mask=[1, 0]), "trajectories[0].loss_mask"),
    "unequal_logprobs": (_bad(trajectories__2__logprobs=[-0.1]), "trajectories[2].logprobs"),
    "unknown_finish_reason": (_bad(trajectories__1__finish_reason="exploded"), "trajectories[1].finish_reason"),
    "mask_not_binary": (_bad(trajectories__0__loss_mask=[2] * 10), "trajectories[0].loss_mask"),
    "negative_token": (_bad(trajectories__0__token_ids=[-1] * 10), "trajectories[0].token_ids"),
    "empty_group": (_bad(trajectories=[]), "trajectories"),
    "missing_id": (_bad(id=_DELETE), "id"),
    "wrong_type_version": (_bad(policy_version="twelve"), "policy_version"),
    "negative_version": (_bad(policy_version=-1), "policy_version"),
    "unknown_field": (_bad(trajectories__0__rewardz=1), "trajectories[0].rewardz"),
    "bad_max_tokens": (_bad(sampling={"max_tokens": 0}), "sampling.max_tokens"),
    "zero_temperature": (_bad(sampling={"temperature": 0}), "sampling.temperature"),
    "text_temperature": (_bad(sampling={"temperature": "hot"}), "sampling.temperature"),
    "bool_temperature": (_bad(sampling={"temperature": True}), "sampling.temperature"),
    "negative_temperature": (_bad(sampling={"temperature": -0.5}), "sampling.temperature"),
    "no_answer_at_all": (_bad(trajectories__0__messages=[{"role": "user", "content": "hi"}]), "trajectories[0].final_answer"),
    "unknown_role": (_bad(trajectories__0__messages=[{"role": "robot", "content": "x"}]), "trajectories[0].messages[0].role"),
}


class TestBadInput:
    @pytest.mark.parametrize("case", sorted(BAD_GROUPS))
    def test_rejected_with_field_named_and_nothing_stored(self, client, session, case):
        body, field = BAD_GROUPS[case]
        r = client.post("/v1/groups", json=body)
        assert 400 <= r.status_code < 500, r.text
        assert field in r.json()["error"], r.json()
        assert counts(session) == (0, 0, 0)

    @pytest.mark.parametrize(
        "raw, field",
        [
            (b'{"id": "x", "prompt_id": "p", "policy_version": 1, "trajectories": [{"logprobs": [NaN], "token_ids": [1], "finish_reason": "stop", "final_answer": "a"}]}', "trajectories[0].logprobs[0]"),
            (b'{"id": "x", "prompt_id": "p", "policy_version": 1, "trajectories": [{"final_answer": "a", "finish_reason": "stop", "metadata": {"score": Infinity}}]}', "metadata.score"),
        ],
    )
    def test_nan_and_inf_rejected(self, client, session, raw, field):
        r = client.post("/v1/groups", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422 and field in r.json()["error"], r.text
        assert counts(session) == (0, 0, 0)

    def test_malformed_json_is_400(self, client, session):
        r = client.post("/v1/groups", content=b'{"id": "x", "trajectories": [', headers={"content-type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        assert counts(session) == (0, 0, 0)

    def test_unknown_prompt_without_inline_prompt(self, client, session):
        r = client.post("/v1/groups", json=make_group("orphan", prompt_id="nope", inline_prompt=False))
        assert r.status_code == 422 and "prompt_id" in r.json()["error"] and "nope" in r.json()["error"]
        assert counts(session) == (0, 0, 0)

    def test_oversized_group(self, client, session):
        client.app.state.settings = client.app.state.settings.model_copy(update={"max_group_size": 3})
        r = client.post("/v1/groups", json=make_group("big", n=4))
        assert r.status_code == 422 and "trajectories" in r.json()["error"] and "limit of 3" in r.json()["error"]
        assert counts(session) == (0, 0, 0)

    def test_body_over_limit_is_413(self, db_url, session):
        from fastapi.testclient import TestClient

        from service.app import create_app
        from service.settings import Settings

        app = create_app(Settings(max_body_bytes=1000, database_url=db_url), database_url=db_url)
        with TestClient(app) as c:
            r = c.post("/v1/groups", json=make_group("huge", n=8))
            assert r.status_code == 413 and "body" in r.json()["error"]
            # chunked upload without content-length is cut while streaming
            r = c.post("/v1/groups", content=iter([orjson.dumps(make_group("huge2", n=8))]))
            assert r.status_code == 413
        assert counts(session) == (0, 0, 0)

    def test_duplicate_ids_in_one_batch(self, client, session):
        r = client.post("/v1/groups", json={"groups": [make_group("dup"), make_group("dup")]})
        assert r.status_code == 422 and "groups[1].id" in r.json()["error"]
        assert counts(session) == (0, 0, 0)


class TestListing:
    def test_filters_and_cursor_pagination(self, client):
        for i in range(5):
            g = make_group(f"l-{i}", prompt_id=f"lp-{i}", policy_version=i % 2, dataset="a" if i < 3 else "b")
            assert client.post("/v1/groups", json=g).status_code == 201
        page = client.get("/v1/groups", params={"limit": 2}).json()
        ids = [g["id"] for g in page["groups"]]
        while page["next_cursor"]:
            page = client.get("/v1/groups", params={"limit": 2, "cursor": page["next_cursor"]}).json()
            ids += [g["id"] for g in page["groups"]]
        assert ids == [f"l-{i}" for i in range(5)]
        assert [g["id"] for g in client.get("/v1/groups", params={"dataset": "b"}).json()["groups"]] == ["l-3", "l-4"]
        assert [g["id"] for g in client.get("/v1/groups", params={"policy_version": 1}).json()["groups"]] == ["l-1", "l-3"]
        assert client.get("/v1/groups", params={"status": "received"}).json()["groups"][0]["status"] == "received"
        assert client.get("/v1/groups", params={"status": "bogus"}).status_code == 422
        assert "cursor" in client.get("/v1/groups", params={"cursor": "abc"}).json()["error"]

    def test_unknown_group_is_404(self, client):
        r = client.get("/v1/groups/missing")
        assert r.status_code == 404 and "missing" in r.json()["error"]


def test_inline_prompt_only_creates(client, session):
    """An inline prompt never changes a stored prompt's reference: 409 naming the field, nothing stored."""
    assert client.post("/v1/groups", json=make_group("u-1", prompt_id="up", reference={"answer": "1"})).status_code == 201
    r = client.post("/v1/groups", json=make_group("u-2", prompt_id="up", reference={"answer": "2"}))
    assert r.status_code == 409 and r.json()["error"].startswith("prompt.reference:")
    assert session.get(Prompt, "up").reference == {"answer": "1"}
    assert session.scalar(select(func.count()).select_from(Group).where(Group.id == "u-2")) == 0


def test_trajectory_without_tokens_is_accepted(client):
    t = make_trajectory()
    for k in ("token_ids", "loss_mask", "logprobs"):
        del t[k]
    group = make_group("nt-1")
    group["trajectories"] = [t, copy.deepcopy(t)]
    assert client.post("/v1/groups", json=group).status_code == 201
    assert client.get("/v1/groups/nt-1").json()["trajectories"][0]["num_tokens"] == 0


def test_one_request_with_two_versions_of_an_inline_prompt_is_refused(client, session):
    groups = [make_group("tw-1", prompt_id="tw", reference={"answer": "1"}),
              make_group("tw-2", prompt_id="tw", reference={"answer": "2"})]
    r = client.post("/v1/groups", json={"groups": groups})
    assert r.status_code == 422 and r.json()["error"].startswith("groups[1].prompt: differs from groups[0].prompt")
    assert session.get(Prompt, "tw") is None


# -- 1. idempotency hash: a big integer in free-form JSON -> 500 -----------------------------------------
# Attack: an integer beyond 64 bits in free-form metadata crashed the idempotency hash (orjson) -> 500.
def test_big_integer_in_metadata_is_not_a_server_error(api):
    """The canonical hash serialises with orjson, which refuses integers beyond 64 bits (TypeError): a
    group whose metadata holds one (a 128-bit seed, a snowflake id) answered 500, now on every retry."""
    g = make_group("bigint-1", prompt_id="bp1", metadata={"seed": 2**70})
    r = api.post("/v1/groups", json=g)
    assert r.status_code < 500, r.text
    assert r.status_code == 422 and "metadata" in r.json()["error"], r.text  # refused at the door, named
    assert api.get("/v1/groups/bigint-1").status_code == 404  # nothing of it stored
    if r.status_code in (200, 201):  # accepted: an identical retry is a duplicate, not a conflict
        again = api.post("/v1/groups", json=g)
        assert again.status_code in (200, 201), again.text


def test_the_old_finish_reason_tool_error_is_stored_as_tool_failure(client) -> None:
    from tests.helpers import make_group as _group

    body = _group("g-old-reason", prompt_id="p-old-reason")
    body["trajectories"][1]["finish_reason"] = "tool_error"
    body["trajectories"][2]["finish_reason"] = "tool_misuse"
    assert client.post("/v1/groups", json=body).status_code in (200, 201)
    got = client.get("/v1/groups/g-old-reason").json()
    assert [t["finish_reason"] for t in got["trajectories"]][:3] == ["stop", "tool_failure", "tool_misuse"]
    body = _group("g-bad-reason", prompt_id="p-bad-reason")
    body["trajectories"][0]["finish_reason"] = "tool_eror"
    r = client.post("/v1/groups", json=body)
    assert r.status_code == 422 and "finish_reason" in r.text

"""The rules of a slot fill and of per-token versions, over real HTTP on a real PostgreSQL with the real
worker (docs/curation.md, "Remedies"): a segmented replacement is stored exactly as POST /v1/groups stores
segments (GET and leases read it); a fill after the deadline is a 409 even before the maintenance ran; the
versions rule is one check at ingest and at a fill; with no wait a resume member asks for a fresh group;
the pass rate leaves masked members out; an untrainable group's drop names its policy."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from service.worker.pipeline import drain
from tests.helpers import assert_client_error, make_group, make_trajectory, register_spec

SPEC = {"name": "math", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}


def _setup(api, name: str, action: str = "resample", **policy) -> None:
    register_spec(api, SPEC)
    body = {"name": name, "finish_reason_actions": {"length": action}, "resample_wait_seconds": 3600, **policy}
    assert api.post("/v1/curation-policies", json=body).status_code == 201, body
    assert api.put(f"/v1/datasets/{name}", json={"reward_spec": "math", "curation_policy": name}).status_code == 200


def _cut_group(gid: str, dataset: str) -> dict:
    g = make_group(gid, prompt_id=f"p-{gid}", dataset=dataset, answers=["42", "41", "42", "7"])
    g["trajectories"][3]["finish_reason"] = "length"
    return g


def _waiting(api, scorer, gid: str, dataset: str) -> None:
    assert api.post("/v1/groups", json=_cut_group(gid, dataset)).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get(f"/v1/groups/{gid}").json()["status"] == "waiting"


def _segmented(answer: str) -> dict:
    t = make_trajectory(answer=answer, seed=4)
    for k in ("token_ids", "loss_mask", "logprobs"):
        del t[k]
    t["segments"] = [
        {"token_ids": [3, 4, 5], "loss_mask": [0, 1, 1], "logprobs": [0.0, -0.25, -0.5],
         "messages": [{"role": "assistant", "content": "summary so far"}]},
        {"token_ids": [6, 7, 8, 9], "loss_mask": [0, 0, 1, 1], "logprobs": [0.0, 0.0, -0.125, -1.0]},
    ]
    return t


def test_a_segmented_fill_is_stored_like_posted_segments_and_read_and_leased(api, scorer):
    _setup(api, "segfill")
    _waiting(api, scorer, "s", "segfill")
    fill = {"policy_version": 0, "trajectory": _segmented("42")}
    r = api.post("/v1/groups/s/trajectories/3", json=fill)
    assert r.status_code == 201, r.text
    with api.factory() as s:  # the same JSONB shape as POST /v1/groups writes: an array, not a JSON string
        kind = s.execute(text("SELECT jsonb_typeof(t.segments) FROM trajectories t JOIN groups g ON g.pk = "
                              "t.group_pk WHERE g.id = 's' AND t.idx = 3")).scalar_one()
    assert kind == "array"
    got = api.get("/v1/groups/s", params={"include_tokens": True})
    assert got.status_code == 200, got.text
    member = got.json()["trajectories"][3]
    assert [seg["token_ids"] for seg in member["segments"]] == [[3, 4, 5], [6, 7, 8, 9]]
    assert member["segments"][0]["messages"][0]["content"] == "summary so far"
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/s").json()["status"] == "ready"
    lease = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 5})
    assert lease.status_code == 200, lease.text
    [leased] = [t for t in lease.json()["groups"][0]["trajectories"] if t["index"] == 3]
    assert [seg["token_ids"] for seg in leased["segments"]] == [[3, 4, 5], [6, 7, 8, 9]]
    assert [seg["loss_mask"] for seg in leased["segments"]] == [[0, 1, 1], [0, 0, 1, 1]]


def test_a_fill_after_the_deadline_is_a_409_before_the_maintenance_ran(api, scorer):
    _setup(api, "late")
    _waiting(api, scorer, "l", "late")
    before = api.get("/v1/groups/l?include_tokens=true").json()
    with api.factory.begin() as s:  # the deadline passes on the database's clock; no maintenance runs
        s.execute(text("UPDATE groups SET wait_until = now() - interval '1 second' WHERE id = 'l'"))
    late = {"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=3)}
    assert_client_error(api.post("/v1/groups/l/trajectories/3", json=late), "index", (409,))
    after = api.get("/v1/groups/l?include_tokens=true").json()
    assert after["trajectories"] == before["trajectories"] and after["status"] == "waiting"
    with api.factory.begin() as s:  # a deadline still ahead: the fill is taken
        s.execute(text("UPDATE groups SET wait_until = now() + interval '1 hour' WHERE id = 'l'"))
    assert api.post("/v1/groups/l/trajectories/3", json=late).status_code == 201


def _versions_group(gid: str, versions: list[int], policy_version: int = 2) -> dict:
    g = make_group(gid, prompt_id=f"p-{gid}", answers=["42", "41"], n=2, policy_version=policy_version)
    g["trajectories"][1]["versions"] = versions
    return g


OK_MASK = [-1] * 4 + [2] * 6  # make_trajectory: 4 prompt tokens (mask 0), 6 generated (mask 1)


@pytest.mark.parametrize(("versions", "field"), [
    ([-1] * 4 + [2] * 5 + [3], "trajectories[1].versions[9]"),  # newer than the group's policy_version
    ([-1] * 4 + [2] * 5 + [999], "trajectories[1].versions[9]"),
    ([-1] * 4 + [-1] + [2] * 5, "trajectories[1].versions[4]"),  # a generated token without its version
    ([-1] * 3 + [0] + [2] * 6, "trajectories[1].versions[3]"),  # a version on a prompt token
])
def test_ingest_refuses_versions_that_break_the_rule(api, versions, field):
    r = api.post("/v1/groups", json=_versions_group("v", versions))
    assert_client_error(r, field, (422,))
    assert api.get("/v1/groups/v").status_code == 404


def test_ingest_takes_versions_that_keep_the_rule(api):
    for gid, versions in (("ok", OK_MASK), ("mixed", [-1] * 4 + [0, 0, 1, 1, 2, 2])):
        r = api.post("/v1/groups", json=_versions_group(gid, versions))
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(("versions", "field"), [
    ([-1] * 4 + [0] * 5 + [1], "trajectory.versions[9]"),  # newer than the fill's policy_version 0
    ([-1] * 4 + [-1] + [0] * 5, "trajectory.versions[4]"),
    ([0] + [-1] * 3 + [0] * 6, "trajectory.versions[0]"),
])
def test_a_resample_fill_is_held_to_the_same_versions_rule(api, scorer, versions, field):
    _setup(api, "fillv")
    _waiting(api, scorer, "f", "fillv")
    body = {"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=8, versions=versions)}
    assert_client_error(api.post("/v1/groups/f/trajectories/3", json=body), field, (422,))
    assert api.get("/v1/groups/f").json()["status"] == "waiting"


def test_no_wait_resume_asks_for_a_fresh_group(api, scorer):
    _setup(api, "nowait", action="resume", resample_wait_seconds=0)
    assert api.post("/v1/groups", json=_cut_group("n", "nowait")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    g = api.get("/v1/groups/n").json()
    assert g["status"] == "ready" and g["trajectories"][3]["advantage"] == 0.0
    reqs = api.get("/v1/sampling/requests", params={"producer_id": "p", "n": 10, "dataset": "nowait"}).json()
    fresh = [(r["reason"], r["prompt_id"], r["n"], r.get("group_id")) for r in reqs["requests"]]
    assert fresh == [("resample", "p-n", 1, None)]
    # at the larger budget, like a resample member's fresh group: a member cut again at the same budget is
    # the likely outcome of the original one
    assert reqs["requests"][0]["budget"]["max_tokens"] == 32  # 16 x the default multiplier 2


def test_pass_rate_leaves_masked_members_out(api, scorer):
    register_spec(api, SPEC)
    assert api.put("/v1/datasets/pr", json={"reward_spec": "math"}).status_code == 200
    # default policy: length -> mask. Outcomes 1, 0, and the masked member's 1 (left out): 0.5, not 2/3
    g = make_group("pr", prompt_id="p-pr", dataset="pr", answers=["42", "41", "42"], n=3)
    g["trajectories"][2]["finish_reason"] = "length"
    assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/pr").json()["trajectories"][2]["action"] == "mask"
    rows = {row["key"]: row for row in api.get("/v1/stats", params={"by": "dataset"}).json()["rows"]}
    assert rows["pr"]["pass_rate"] == pytest.approx(0.5)


def test_pass_rate_counts_the_baseline_members_only(api, scorer):
    """Attack: /v1/stats' pass_rate counted environment failures and the masked member of a dropped group
    (their outcome 0). It is the baseline's, as curation and the curriculum see it: an environment failure
    is out, a cut member is out, the members of a zero-variance group are in."""
    register_spec(api, SPEC)
    assert api.put("/v1/datasets/prb", json={"reward_spec": "math"}).status_code == 200
    env = make_group("env", prompt_id="p-env", dataset="prb", answers=["42", "41", "42", "7", "7"], n=5)
    env["trajectories"][3]["finish_reason"] = "env_error"
    env["trajectories"][4]["finish_reason"] = "tool_failure"
    zero = make_group("zv", prompt_id="p-zv", dataset="prb", answers=["42", "42", "7"], n=3)
    zero["trajectories"][2]["finish_reason"] = "length"  # masked: out, so the group is zero-variance
    for g in (env, zero):
        assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/zv").json()["status"] == "dropped"
    rows = {row["key"]: row for row in api.get("/v1/stats", params={"by": "dataset"}).json()["rows"]}
    assert rows["prb"]["pass_rate"] == pytest.approx((2 + 2) / (3 + 2))  # not (2 + 2) / 8


def _prompt_outcomes(api, prompt_id: str) -> list:
    with api.factory() as s:
        return list(s.execute(text("SELECT recent_outcomes FROM prompts WHERE id = :id"),
                              {"id": prompt_id}).scalar_one() or [])


def test_a_group_below_min_group_size_adds_nothing_to_its_prompts_pass_rate(api, scorer):
    _setup(api, "small", action="drop", min_group_size=3)
    g = make_group("b", prompt_id="p-b", dataset="small", answers=["42", "41", "42"], n=3)
    g["trajectories"][2]["finish_reason"] = "length"  # dropped: 2 baseline members < 3
    assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/b").json()["drop_reason"] == "below_min_group_size"
    assert _prompt_outcomes(api, "p-b") == []


def test_an_untrainable_groups_drop_names_its_policy(api, scorer):
    _setup(api, "untr")
    g = make_group("u", prompt_id="p-u", dataset="untr", answers=["42", "41"], n=2)
    del g["trajectories"][0]["loss_mask"]
    assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    out = api.get("/v1/groups/u").json()
    assert (out["status"], out["drop_reason"]) == ("dropped", "untrainable")
    [d] = [d for d in out["decisions"] if d["rule"] == "untrainable"]
    assert d["policy"] is not None and "untr" in str(d["policy"]), d


# -- a fill is trainable, answers its group's prompt and the request it names --------------------------
SHARED_PROMPT = [11, 12, 13, 14]


def _same_prompt_group(gid: str, dataset: str, policy_version: int = 0) -> dict:
    """Every member begins with the same prompt tokens (as a real producer's do); member 3 cut."""
    g = _cut_group(gid, dataset)
    g["policy_version"] = policy_version
    for t in g["trajectories"]:
        t["token_ids"][:4] = SHARED_PROMPT
    return g


@pytest.mark.parametrize(("drop", "field"), [
    (("token_ids", "loss_mask", "logprobs"), "trajectory.token_ids"),
    (("loss_mask",), "trajectory.loss_mask"),
])
def test_a_fill_without_token_arrays_is_a_422_not_a_group_dropped_later(api, scorer, drop, field):
    _setup(api, "bare")
    _waiting(api, scorer, "b", "bare")
    t = make_trajectory(answer="42", seed=8)
    for k in drop:
        del t[k]
    assert_client_error(api.post("/v1/groups/b/trajectories/3", json={"policy_version": 0, "trajectory": t}),
                        field, (422,))
    assert api.get("/v1/groups/b").json()["status"] == "waiting"
    good = {"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=8)}
    assert api.post("/v1/groups/b/trajectories/3", json=good).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/b").json()["status"] == "ready"


def test_a_fill_answering_another_prompt_is_refused(api, scorer):
    _setup(api, "prompt")
    assert api.post("/v1/groups", json=_same_prompt_group("a", "prompt")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    for at in range(4):  # any one differing prompt token, the position named
        t = make_trajectory(answer="42", seed=8)
        t["token_ids"][:4] = SHARED_PROMPT
        t["token_ids"][at] = 99
        r = api.post("/v1/groups/a/trajectories/3", json={"policy_version": 0, "trajectory": t})
        assert_client_error(r, f"trajectory.token_ids[{at}]", (422,))
    shorter = make_trajectory(answer="42", seed=8, prompt_len=3)
    shorter["token_ids"][:3] = SHARED_PROMPT[:3]  # a prefix of the prompt, then generated tokens
    r = api.post("/v1/groups/a/trajectories/3", json={"policy_version": 0, "trajectory": shorter})
    assert_client_error(r, "trajectory.token_ids[3]", (422,))
    assert api.get("/v1/groups/a").json()["status"] == "waiting"
    t = make_trajectory(answer="42", seed=8)
    t["token_ids"][:4] = SHARED_PROMPT
    assert api.post("/v1/groups/a/trajectories/3", json={"policy_version": 0, "trajectory": t}).status_code == 201


def test_a_fill_naming_another_request_is_a_409(api, scorer):
    _setup(api, "tied")
    _waiting(api, scorer, "x", "tied")
    _waiting(api, scorer, "y", "tied")
    taken = api.get("/v1/sampling/requests", params={"producer_id": "p", "n": 10, "dataset": "tied"}).json()
    ids = {r["group_id"]: r["request_id"] for r in taken["requests"] if r.get("group_id")}
    assert set(ids) == {"x", "y"}
    body = {"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=8), "request_id": ids["x"]}
    r = api.post("/v1/groups/y/trajectories/3", json=body)  # x's answer posted to y's slot
    assert_client_error(r, "request_id", (409,))
    assert "another group" in r.json()["error"]
    assert api.get("/v1/groups/y").json()["status"] == "waiting"
    assert api.post("/v1/groups/x/trajectories/3", json=body).status_code == 201
    again = api.post("/v1/groups/x/trajectories/3", json=body)
    assert again.status_code == 200  # the same fill again: idempotent
    # ... but not under another request's id (attack: the replay answered 200 to any request_id)
    foreign = api.post("/v1/groups/x/trajectories/3", json={**body, "request_id": ids["y"]})
    assert_client_error(foreign, "request_id", (409,))


def test_done_after_the_deadline_leaves_the_slot_expired(api, scorer):
    """Attack: POST /v1/sampling/requests/done on an expired remedy request turned it back to done, and a
    late fill then counted as an open slot's (the group waited for it again)."""
    from service.curation.service import expire_waits

    _setup(api, "expiry")
    _waiting(api, scorer, "e", "expiry")
    taken = api.get("/v1/sampling/requests", params={"producer_id": "p", "n": 10, "dataset": "expiry"}).json()
    (rid,) = [r["request_id"] for r in taken["requests"] if r.get("group_id") == "e"]
    with api.factory.begin() as s:
        s.execute(text("UPDATE groups SET wait_until = now() - interval '1 second' WHERE id = 'e'"))
    with api.factory.begin() as s:
        expire_waits(s)
    assert api.post("/v1/sampling/requests/done", json={"request_ids": [rid]}).status_code == 200
    with api.factory() as s:
        status = s.execute(text("SELECT status FROM sampling_requests WHERE pk = :pk"), {"pk": rid}).scalar_one()
    assert status == "expired"
    with api.factory.begin() as s:  # the group waits again (another slot's remedy, say): slot 3 is not open
        s.execute(text("UPDATE groups SET status = 'waiting', wait_until = now() + interval '1 hour' WHERE id = 'e'"))
    late = {"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=3), "request_id": rid}
    assert_client_error(api.post("/v1/groups/e/trajectories/3", json=late), "index", (409,))


# -- staleness is measured from the oldest token ---------------------------------------------------------
def _stale_policy(api, name: str) -> None:
    _setup(api, name, max_staleness=1)


def test_a_fill_older_than_its_group_is_refused_and_the_group_still_trains(api, scorer):
    """Group at version 5, trainer at 6, max_staleness 1: fresh enough. Attack: a replacement sampled by
    version 0 was taken (201) and made the whole group stale -- any producer could drop any waiting group's
    completers by answering its request with old tokens, worse than ignoring it. Now a fill older than every
    member is a 422 naming policy_version, nothing stored; the slot stays open for a fresh one."""
    _stale_policy(api, "old")
    assert api.post("/v1/policy", json={"version": 6, "metrics": {}}).status_code == 201
    for gid in ("fresh", "smuggled"):
        assert api.post("/v1/groups", json=_cut_group(gid, "old") | {"policy_version": 5}).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    old = api.post("/v1/groups/smuggled/trajectories/3",
                   json={"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=8)})
    assert_client_error(old, "policy_version")
    assert "older than every member" in old.json()["error"]
    # the same by per-token versions: a fill posted at 5 whose generated tokens say version 4
    t = make_trajectory(answer="42", seed=8)
    t["versions"] = [4 if m else -1 for m in t["loss_mask"]]
    assert_client_error(api.post("/v1/groups/smuggled/trajectories/3", json={"policy_version": 5, "trajectory": t}),
                        "policy_version")
    assert api.get("/v1/groups/smuggled").json()["status"] == "waiting"  # nothing of the refusals stored
    for gid in ("fresh", "smuggled"):
        body = {"policy_version": 5, "trajectory": make_trajectory(answer="42", seed=8)}
        assert api.post(f"/v1/groups/{gid}/trajectories/3", json=body).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert [api.get(f"/v1/groups/{gid}").json()["status"] for gid in ("fresh", "smuggled")] == ["ready", "ready"]
    lease = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10})
    assert sorted(g["id"] for g in lease.json()["groups"]) == ["fresh", "smuggled"]


def test_a_fill_that_generated_nothing_is_refused_before_its_prompt_escapes_the_check(api, scorer):
    """Attack: a replacement with a foreign prompt and one loss_mask 1 was refused, but the same tokens with an
    all-zero loss_mask have no prompt to compare (nothing generated) and were taken, its wrong answer moving
    the completers' advantages. A replacement generates at least one token: 422 naming loss_mask."""
    _setup(api, "zero")
    assert api.post("/v1/groups", json=_same_prompt_group("z", "zero")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    foreign = {"messages": [{"role": "assistant", "content": "The answer is \\boxed{41}"}],
               "token_ids": [400 + i for i in range(10)], "loss_mask": [0] * 10, "finish_reason": "stop"}
    assert_client_error(api.post("/v1/groups/z/trajectories/3", json={"policy_version": 0, "trajectory": foreign}),
                        "trajectory.loss_mask")
    seg = _segmented("41")
    for x in seg["segments"]:
        x["loss_mask"] = [0] * len(x["token_ids"])
    assert_client_error(api.post("/v1/groups/z/trajectories/3", json={"policy_version": 0, "trajectory": seg}),
                        "trajectory.segments[].loss_mask")
    assert api.get("/v1/groups/z").json()["status"] == "waiting"


def test_a_segmented_fill_counts_every_segments_tokens_in_its_group(api, scorer):
    """Attack: the group's n_tokens after a segmented fill counted the fill's (absent) top-level token_ids."""
    _setup(api, "segn")
    _waiting(api, scorer, "n", "segn")
    def listed() -> int:
        [row] = [x for x in api.get("/v1/groups", params={"dataset": "segn"}).json()["groups"] if x["id"] == "n"]
        return row["n_tokens"]

    before = listed()
    assert api.post("/v1/groups/n/trajectories/3",
                    json={"policy_version": 0, "trajectory": _segmented("42")}).status_code == 201
    cut = len(_cut_group("n", "segn")["trajectories"][3]["token_ids"])
    assert listed() == before - cut + 3 + 4


@pytest.mark.parametrize("index", ["03", "3.0", "%203", "+3", "3e0"])
def test_a_fill_index_is_plain_decimal(api, scorer, index):
    """Attack: /trajectories/03, /3.0 and /%203 were all read as slot 3."""
    _setup(api, "idx")
    _waiting(api, scorer, "i", "idx")
    r = api.post(f"/v1/groups/i/trajectories/{index}",
                 json={"policy_version": 0, "trajectory": make_trajectory(answer="42", seed=8)})
    assert_client_error(r, "index")
    assert api.get("/v1/groups/i").json()["status"] == "waiting"


@pytest.mark.parametrize(("oldest", "stale"), [(5, False), (4, True), (0, True)])
def test_per_token_versions_of_a_post_count_for_staleness(api, scorer, oldest, stale):
    """A trajectory whose tokens name an older policy (a partial rollout) is as stale as its oldest token:
    the curation policy's limit and a lease's max_staleness both read it."""
    register_spec(api, SPEC)
    assert api.put("/v1/datasets/tok", json={"reward_spec": "math"}).status_code == 200
    assert api.post("/v1/policy", json={"version": 6, "metrics": {}}).status_code == 201
    g = make_group("v", prompt_id="p-v", dataset="tok", answers=["42", "41", "42", "41"], policy_version=5)
    mask = g["trajectories"][2]["loss_mask"]
    g["trajectories"][2]["versions"] = [-1 if m == 0 else (oldest if i == len(mask) - 1 else 5)
                                        for i, m in enumerate(mask)]
    assert api.post("/v1/groups", json=g).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/v").json()["status"] == "ready"  # the dataset's policy has no max_staleness
    lease = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10, "max_staleness": 1})
    if stale:
        assert lease.status_code == 204
        v = api.get("/v1/groups/v").json()
        assert (v["status"], v["drop_reason"]) == ("dropped", "stale")
        [d] = [d for d in v["decisions"] if d["rule"] == "stale"]
        assert f"its oldest token by version {oldest}" in d["reason"]
    else:
        assert [x["id"] for x in lease.json()["groups"]] == ["v"]
        assert api.post(f"/v1/batches/{lease.json()['batch_id']}/ack").status_code == 200
        assert api.get("/v1/groups/v").json()["staleness"] == 1


def _old_cut_member_group(gid: str, dataset: str) -> dict:
    """Group at version 10; members 2 and 3 cut, member 2's tokens generated by version 1."""
    g = make_group(gid, prompt_id=f"p-{gid}", dataset=dataset, answers=["42", "41", "7", "7"], policy_version=10)
    for i in (2, 3):
        g["trajectories"][i]["finish_reason"] = "length"
    g["trajectories"][2]["versions"] = [1 if m else -1 for m in g["trajectories"][2]["loss_mask"]]
    return g


@pytest.mark.parametrize("segmented", [False, True])
def test_an_old_cut_member_lets_no_older_fill_in(api, scorer, segmented):
    """Re-attack: the age check compared a fill with every member, so a cut member's old tokens (which train
    nothing) let a fill by version 1 in, and the group then went stale with its completers; a segmented fill
    (no per-token versions stored) hid its version altogether. A fill is judged against the members that
    train; a segmented one is posted at its group's version or newer."""
    _setup(api, "oldcut", max_staleness=2)
    assert api.post("/v1/policy", json={"version": 10, "metrics": {}}).status_code == 201
    assert api.post("/v1/groups", json=_old_cut_member_group("o", "oldcut")).status_code == 201
    drain(api.factory, scorer, timeout_s=60)
    assert api.get("/v1/groups/o").json()["status"] == "waiting"
    fill = _segmented("42") if segmented else make_trajectory(answer="42", seed=9)
    for version in (1, 9):
        r = api.post("/v1/groups/o/trajectories/3", json={"policy_version": version, "trajectory": fill})
        assert_client_error(r, "policy_version")
    assert api.post("/v1/groups/o/trajectories/3", json={"policy_version": 10, "trajectory": fill}).status_code == 201


def test_a_fill_with_no_token_to_train_is_refused(api, scorer):
    """Re-attack: a segmented fill whose only loss_mask 1 is each segment's first token trains nothing (a token
    is trained from the ones before it), yet it was kept and its reward entered the baseline."""
    _setup(api, "notarget")
    _waiting(api, scorer, "nt", "notarget")
    seg = _segmented("42")
    for x in seg["segments"]:
        x["loss_mask"] = [1] + [0] * (len(x["token_ids"]) - 1)
    assert_client_error(api.post("/v1/groups/nt/trajectories/3", json={"policy_version": 0, "trajectory": seg}),
                        "trajectory.segments[].loss_mask")
    flat = make_trajectory(answer="42", seed=9)
    flat["loss_mask"] = [1] + [0] * (len(flat["token_ids"]) - 1)
    assert_client_error(api.post("/v1/groups/nt/trajectories/3", json={"policy_version": 0, "trajectory": flat}),
                        "trajectory.loss_mask")

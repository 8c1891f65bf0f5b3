"""Export: each format, as Parquet (read back with ``datasets``) and JSONL, checked row by row against the
store; filters; bad filters rejected before anything streams; the CLI writes the same file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from reward_models.scoring import Scorer
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group, register_spec, tool_episode

SPEC = {"name": "exp", "components": [
    {"name": "correct", "kind": "verifier.math", "outcome": True},
    {"name": "fmt", "kind": "rule.format", "weight": 0.5, "params": {"required_tags": ["answer"]}},
]}
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def answer(a: str, tag: bool = False, **kw) -> dict:
    text = f"<answer>\\boxed{{{a}}}</answer>" if tag else f"The answer is \\boxed{{{a}}}"
    return {"messages": [{"role": "assistant", "content": text}], "finish_reason": kw.pop("finish_reason", "stop"),
            "num_tokens": 5, **kw}


def groups() -> list[dict]:
    mixed = make_group("g-mixed", prompt_id="p-1", policy_version=1, trajectories=[
        answer("42"), answer("41", tag=True), answer("42", tag=True), answer("7")])
    same_prompt_again = make_group("g-again", prompt_id="p-1", policy_version=2, trajectories=[
        answer("42", tag=True), answer("42"), answer("0", finish_reason="length")])  # same best as g-mixed
    all_right = make_group("g-right", prompt_id="p-2", policy_version=2, dataset="other",
                           trajectories=[answer("42"), answer("42")])  # ties: no DPO pair
    tool = tool_episode()
    tool["messages"][-1]["content"] = "\\boxed{42}"
    with_tools = make_group("g-tools", prompt_id="p-3", policy_version=3, trajectories=[
        tool, answer("5", finish_reason="tool_error")])
    with_tools["prompt"]["metadata"] = {"tools": TOOLS}
    truncated = make_group("g-cut", prompt_id="p-4", policy_version=3, trajectories=[
        answer("42", finish_reason="length"), answer("1")])
    return [mixed, same_prompt_again, all_right, with_tools, truncated]


@pytest.fixture(scope="module")
def store(make_db) -> Iterator[TestClient]:
    from service.app import create_app

    url = make_db()
    app = create_app(database_url=url)
    with TestClient(app) as client:
        assert client.post("/v1/reward-specs", json=SPEC).status_code == 201
        for ds in ("toy", "other"):
            assert client.put(f"/v1/datasets/{ds}", json={"reward_spec": "exp"}).status_code == 200
        assert client.post("/v1/groups", json={"groups": groups()}).status_code == 201
        with Scorer(processes=1, timeout_s=10) as scorer:
            drain(make_sessionmaker(get_engine(url)), scorer, timeout_s=120)
        yield client


def stored(client: TestClient) -> list[dict]:
    """Every group as the API shows it, with its prompt: the reference the exports are checked against."""
    out = []
    for g in groups():
        body = client.get(f"/v1/groups/{g['id']}").json()
        assert body["status"] not in ("received", "reward_error"), body
        body["prompt_messages"], body["tools"] = g["prompt"]["messages"], g["prompt"].get("metadata", {}).get("tools")
        out.append(body)
    return out


def export(client: TestClient, filetype: str, tmp_path: Path, **params) -> list[dict]:
    r = client.get("/v1/export", params={**params, "filetype": filetype})
    assert r.status_code == 200, r.text
    path = tmp_path / f"out.{filetype}"
    path.write_bytes(r.content)
    if filetype == "jsonl" and not r.content:
        return []  # nothing matched (datasets cannot read an empty JSON file)
    from datasets import load_dataset

    ds = load_dataset("parquet" if filetype == "parquet" else "json", data_files=str(path), split="train",
                      cache_dir=str(tmp_path / "cache"))
    if filetype == "parquet":
        return [dict(row) for row in ds]
    # datasets reads JSONL too (checked by the count), but its JSON reader rounds doubles: compare exact values
    rows = [json.loads(line) for line in r.content.splitlines()]
    assert len(rows) == len(ds)
    return rows


def text_of(messages: list[dict]) -> list[tuple[str, str | None]]:
    return [(m["role"], m["content"]) for m in messages]


def usable(g: dict) -> list[dict]:
    return [t for t in g["trajectories"] if t["finish_reason"] == "stop" and t["total_reward"] is not None]


@pytest.mark.parametrize("filetype", ["parquet", "jsonl"])
def test_sft(store: TestClient, tmp_path: Path, filetype: str) -> None:
    rows = export(store, filetype, tmp_path, format="sft")
    expected, seen = [], set()
    for g in stored(store):
        correct = [t for t in usable(g) if t["outcome"] == 1.0]
        if correct:
            best = sorted(correct, key=lambda t: (-t["total_reward"], t["index"]))[0]
            convo = text_of(g["prompt_messages"]) + text_of(best["messages"])
            if repr(convo) not in seen:
                seen.add(repr(convo))
                expected.append((convo, g["tools"]))
    assert len(expected) == 3  # g-again's best repeats g-mixed's (written once); g-cut has no correct stop
    assert [(text_of(r["messages"]), _tools(r)) for r in rows] == expected
    tool_row = next(r for r in rows if _tools(r))
    call = tool_row["messages"][1]["tool_calls"][0]
    assert call["function"] == {"name": "calc", "arguments": {"expr": "6*7"}}  # an object, as TRL's templates need
    rows = export(store, filetype, tmp_path, format="sft", tool_arguments="string")
    call = next(r for r in rows if _tools(r))["messages"][1]["tool_calls"][0]
    assert call["function"] == {"name": "calc", "arguments": '{"expr": "6*7"}'}  # the stored JSON text


def _tools(row: dict):
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


@pytest.mark.parametrize("filetype", ["parquet", "jsonl"])
def test_dpo(store: TestClient, tmp_path: Path, filetype: str) -> None:
    rows = export(store, filetype, tmp_path, format="dpo")
    expected = []
    for g in stored(store):
        right = [t for t in usable(g) if t["outcome"] == 1.0]
        wrong = [t for t in usable(g) if t["outcome"] is not None and t["outcome"] < 1.0]
        if right and wrong:  # mixed groups only: chosen is correct, rejected is not
            best = sorted(right, key=lambda t: (-t["total_reward"], t["index"]))[0]
            worst = sorted(wrong, key=lambda t: (t["total_reward"], t["index"]))[0]
            if best["total_reward"] > worst["total_reward"]:
                expected.append((text_of(g["prompt_messages"]), text_of(best["messages"]), text_of(worst["messages"])))
    # g-again and g-right have only correct stop answers; g-tools and g-cut one usable trajectory
    assert len(expected) == 1
    assert [(text_of(r["prompt"]), text_of(r["chosen"]), text_of(r["rejected"])) for r in rows] == expected


@pytest.mark.parametrize("filetype", ["parquet", "jsonl"])
def test_kto(store: TestClient, tmp_path: Path, filetype: str) -> None:
    rows = export(store, filetype, tmp_path, format="kto")
    expected = [(text_of(g["prompt_messages"]), text_of(t["messages"]), t["outcome"] == 1.0)
                for g in stored(store) for t in usable(g)]
    assert [(text_of(r["prompt"]), text_of(r["completion"]), r["label"]) for r in rows] == expected
    assert {r["label"] for r in rows} == {True, False}


@pytest.mark.parametrize("filetype", ["parquet", "jsonl"])
def test_rollouts(store: TestClient, tmp_path: Path, filetype: str) -> None:
    rows = export(store, filetype, tmp_path, format="rollouts")
    groups_ = stored(store)
    assert len(rows) == sum(len(g["trajectories"]) for g in groups_)
    by_uid = {r["uid"]: r for r in rows}
    assert len(by_uid) == len(rows)
    for g in groups_:
        for t in g["trajectories"]:
            r = by_uid[f"{g['id']}/{t['index']}"]
            assert (r["group_id"], r["index"], r["policy_version"], r["dataset"], r["group_status"]) == (
                g["id"], t["index"], g["policy_version"], g["dataset"], g["status"])
            assert (r["total_reward"], r["outcome"], r["advantage"], r["action"], r["reason"], r["finish_reason"]) == (
                t["total_reward"], t["outcome"], t["advantage"], t["action"], t["reason"], t["finish_reason"])
            assert {x["component"]: (x["value"], x["error"]) for x in r["rewards"]} == {
                k: (v["value"], v["error"]) for k, v in t["rewards"].items()}
            assert r["reward_spec"] == g["reward_spec"] and text_of(r["messages"]) == text_of(t["messages"])
    meta = by_uid["g-tools/0"]["metadata"]
    assert (json.loads(meta) if isinstance(meta, str) else meta) == {"env": "calc-v1"}
    episode = tool_episode()  # stored with token ids, log-probs and a loss mask: exported exactly, as lists
    tool = by_uid["g-tools/0"]
    assert (tool["token_ids"], tool["loss_mask"], tool["logprobs"]) == (
        episode["token_ids"], episode["loss_mask"], episode["logprobs"])  # binary fractions: exact in float32
    plain = by_uid["g-tools/1"]  # posted without token arrays: null, not []
    assert (plain["token_ids"], plain["loss_mask"], plain["logprobs"]) == (None, None, None)


def test_filters(store: TestClient, tmp_path: Path) -> None:
    def uids(**params) -> set[str]:
        return {r["uid"] for r in export(store, "jsonl", tmp_path, format="rollouts", **params)}

    everything = uids()
    assert uids(dataset="other") == {"g-right/0", "g-right/1"}
    assert uids(min_policy_version=3) == {"g-tools/0", "g-tools/1", "g-cut/0", "g-cut/1"}
    assert uids(min_policy_version=2, max_policy_version=2) == {u for u in everything if u.startswith(("g-again", "g-right"))}
    assert uids(status="dropped") | uids(status=["ready"]) == everything
    rows = export(store, "jsonl", tmp_path, format="rollouts", min_reward=1.0)
    assert rows and all(r["total_reward"] >= 1.0 for r in rows)
    assert len(export(store, "jsonl", tmp_path, format="kto", limit=2)) == 2


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"format": "csv"}, "format"),
        ({}, "format"),
        ({"format": "sft", "status": "nope"}, "statuses[0]"),
        ({"format": "sft", "min_policy_version": 3, "max_policy_version": 2}, "min_policy_version"),
        ({"format": "sft", "min_reward": "nan"}, "min_reward"),
        ({"format": "sft", "filetype": "csv"}, "filetype"),
        ({"format": "sft", "limit": 0}, "limit"),
    ],
)
def test_bad_filters_are_422(store: TestClient, params: dict, field: str) -> None:
    r = store.get("/v1/export", params=params)
    assert r.status_code == 422 and field in r.json()["error"], r.text


def test_cli_writes_the_same_rows(store: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli import export as export_cli
    from service.cli import import_prompts as import_cli

    monkeypatch.setattr(import_cli, "http_client", lambda url, key: _Borrowed(store))
    monkeypatch.setattr(export_cli, "http_client", lambda url, key: _Borrowed(store))
    out = tmp_path / "dpo.parquet"
    assert export_cli.main(["--format", "dpo", "--out", str(out)]) == 0
    import pyarrow.parquet as pq

    via_cli = pq.read_table(out).to_pylist()
    assert via_cli == export(store, "parquet", tmp_path, format="dpo") and not out.with_suffix(".parquet.part").exists()
    assert export_cli.main(["--format", "dpo", "--out", str(tmp_path / "x.csv")]) == 1
    assert export_cli.main(["--format", "sft", "--status", "nope", "--out", str(tmp_path / "y.jsonl")]) == 1
    assert not (tmp_path / "y.jsonl").exists()


class _Borrowed:
    """The module's TestClient as the CLI's HTTP client (a context manager that does not close it)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def __enter__(self) -> TestClient:
        return self.client

    def __exit__(self, *exc: object) -> None:
        pass


# --- 4. DPO export: pairs from groups that are not mixed -----------------------------------------------------
# Attack: DPO export made pairs from groups that are not mixed (no correct-vs-wrong contrast).

def test_dpo_pairs_come_only_from_mixed_groups(app_client) -> None:
    c, url = app_client
    register_spec(c, {"name": "dpo", "components": [
        {"name": "correct", "kind": "verifier.exact_match", "outcome": True, "params": {"extract_pattern": "(\\d+)"}},
        {"name": "fmt", "kind": "rule.format", "weight": 0.5, "params": {"required_tags": ["answer"]}}]})
    assert c.put("/v1/datasets/toy", json={"reward_spec": "dpo"}).status_code == 200

    def traj(text: str) -> dict:
        return {"messages": [{"role": "assistant", "content": text}], "finish_reason": "stop", "num_tokens": 5}

    # every answer is wrong; one is merely better formatted, so the totals differ (0.5 vs 0.0)
    g = make_group("g-all-wrong", prompt_id="p-1", n=2)
    g["trajectories"] = [traj("<answer>41</answer>"), traj("7")]
    assert c.post("/v1/groups", json={"groups": [g]}).status_code == 201
    with Scorer(processes=1, timeout_s=10) as scorer:
        drain(make_sessionmaker(get_engine(url)), scorer, timeout_s=60)
    scored = c.get("/v1/groups/g-all-wrong").json()
    assert [t["outcome"] for t in scored["trajectories"]] == [0.0, 0.0]
    r = c.get("/v1/export", params={"format": "dpo", "filetype": "jsonl"})
    assert r.status_code == 200, r.text
    rows = [json.loads(line) for line in r.content.splitlines()]
    # today: one pair whose "chosen" is the wrong answer 41 (a DPO dataset that teaches a wrong answer)
    assert rows == [], rows


# Fuzz finding: a policy version beyond int4 passed the query check and failed inside the stream, after the
# response had started (a 500 with a half-sent body): it is a 422 naming the field, before anything is sent.
@pytest.mark.parametrize("field", ["min_policy_version", "max_policy_version"])
def test_a_policy_version_beyond_int4_is_a_422_before_the_stream(lenient_api, field):
    from tests.helpers import assert_client_error

    r = lenient_api.get("/v1/export", params={"format": "kto", field: 385884894978409})
    assert_client_error(r, field, statuses=(422,))
    assert lenient_api.get("/v1/export", params={"format": "kto", field: 2**31 - 1}).status_code == 200

"""Attack findings against the i14 integrations work (each test fails on the code it was written against).

Real parts only: the FastAPI app over real PostgreSQL (TestClient), the real worker pipeline and process
pool, and the live uvicorn service of tests/integrations/conftest.py for the adapters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from reward_models.scoring import Scorer
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.conftest import LiveServer
from tests.helpers import make_group, restart_forkserver


@pytest.fixture
def app_client(make_db) -> Iterator[tuple[TestClient, str]]:
    """A fresh database and the real app; server errors come back as HTTP 500 instead of raising."""
    from service.app import create_app

    url = make_db()
    with TestClient(create_app(database_url=url), raise_server_exceptions=False) as c:
        yield c, url


def _register(c: TestClient, spec: dict) -> None:
    r = c.post("/v1/reward-specs", json=spec)
    assert r.status_code == 201, r.text


# --- 1. external.reported: a finite but huge reported value overflows the weighted total ------------------

def test_score_reported_value_overflowing_the_total_is_a_named_error_not_a_500_or_a_silent_null(app_client) -> None:
    c, _ = app_client
    _register(c, {"name": "env1", "components": [
        {"name": "env", "kind": "external.reported", "weight": 2.0, "outcome": True}]})
    _register(c, {"name": "env2", "components": [
        {"name": "env", "kind": "external.reported", "outcome": True},
        {"name": "env_b", "kind": "external.reported", "params": {"key": "r2"}}]})
    # every component value is finite (external.reported validated it); only the weighted sum overflows
    one = c.post("/v1/score", json={"reward_spec": "env1", "items": [
        {"prompt": "p", "completion": "c", "metadata": {"reward": 1e308}}]})
    two = c.post("/v1/score", json={"reward_spec": "env2", "items": [
        {"prompt": "p", "completion": "c", "metadata": {"reward": 1e308, "r2": 1e308}}]})
    # two components: math.fsum raises OverflowError inside Scorer.score -> the whole batch is a 500
    assert two.status_code == 200, two.text
    assert two.json()["results"][0]["total"] is None
    # one component: total is inf in Python, serialised as null with no component error: a silent null
    res = one.json()["results"][0]
    assert res["total"] is None
    errors = [comp["error"] for comp in res["rewards"].values() if comp["error"]]
    assert errors, f"total is null but no error explains it: {res}"


def test_worker_one_reported_huge_value_does_not_stall_curation_of_other_groups(app_client) -> None:
    c, url = app_client
    _register(c, {"name": "envw", "components": [
        {"name": "env", "kind": "external.reported", "weight": 2.0, "outcome": True}]})
    assert c.put("/v1/datasets/toy", json={"reward_spec": "envw"}).status_code == 200
    poison, normal = make_group("g-poison", prompt_id="p-1", n=3), make_group("g-normal", prompt_id="p-2", n=3)
    for t, v in zip(poison["trajectories"], [1e308, 0.0, 0.5], strict=True):
        t.setdefault("metadata", {})["reward"] = v  # an environment (or a policy gaming it) reports 1e308
    for t, v in zip(normal["trajectories"], [1.0, 0.0, 0.5], strict=True):
        t.setdefault("metadata", {})["reward"] = v
    assert c.post("/v1/groups", json={"groups": [poison, normal]}).status_code == 201
    factory = make_sessionmaker(get_engine(url))
    with Scorer(processes=1, timeout_s=10) as scorer:
        # today: the score pass stores total=inf, then every curate pass raises
        # "ValueError: total inf is not finite" (run_forever logs it and retries forever): nothing curates
        drain(factory, scorer, timeout_s=60)
    assert c.get("/v1/groups/g-normal").json()["status"] in ("ready", "dropped")
    assert c.get("/v1/groups/g-poison").json()["status"] != "scored"


def test_curation_sets_aside_a_group_whose_stored_total_is_not_finite(app_client) -> None:
    """Defence in depth for the finding above: a non-finite total already in the table (an older build,
    a manual edit) makes curation set that group aside as curation_error; the rest of its batch curates."""
    from sqlalchemy import select, update

    from service.store.models import Decision, Group, Trajectory
    from service.worker.pipeline import curate_pass

    c, url = app_client
    _register(c, {"name": "envs", "components": [{"name": "env", "kind": "external.reported", "outcome": True}]})
    assert c.put("/v1/datasets/toy", json={"reward_spec": "envs"}).status_code == 200
    groups = [make_group(f"g-{i}", prompt_id=f"p-{i}", n=3) for i in range(3)]
    for g in groups:
        for t, v in zip(g["trajectories"], [1.0, 0.0, 0.5], strict=True):
            t.setdefault("metadata", {})["reward"] = v
    assert c.post("/v1/groups", json={"groups": groups}).status_code == 201
    factory = make_sessionmaker(get_engine(url))
    with Scorer(processes=1, timeout_s=10) as scorer:
        drain(factory, scorer, timeout_s=60)
    with factory.begin() as session:  # back to 'scored', with one total that is not finite
        pk = session.scalar(select(Group.pk).where(Group.id == "g-1"))
        session.execute(update(Group).values(status="scored", curated_at=None, ready_at=None))
        session.execute(update(Trajectory).where(Trajectory.group_pk == pk, Trajectory.idx == 0)
                        .values(total_reward=float("inf")))
    with factory.begin() as session:
        result = curate_pass(session, 256)
    assert result.ready + result.dropped == 2
    assert [c.get(f"/v1/groups/g-{i}").json()["status"] for i in range(3)] == ["ready", "curation_error", "ready"]
    with factory() as session:
        reasons = session.scalars(select(Decision.reason).where(Decision.group_pk == pk)).all()
    assert any(r.startswith("curation:") and "not finite" in r for r in reasons), reasons


# --- 2. OpenRLHF route: the response is cut at the LAST copy of the prompt ---------------------------------

def test_openrlhf_response_that_repeats_the_prompt_is_scored_whole(app_client) -> None:
    c, _ = app_client
    _register(c, {"name": "lenq", "components": [
        {"name": "correct", "kind": "verifier.exact_match", "outcome": True},
        {"name": "len", "kind": "rule.length", "params": {"target": 20, "limit": 100, "unit": "chars"}}]})
    prompt = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
    # a policy writes 1000 chars of junk (and a wrong answer), then echoes the prompt, then the answer
    response = "41 " + "blah " * 200 + prompt + "42<|im_end|>"
    r = c.post("/compat/openrlhf/lenq/get_reward",
               json={"query": [prompt + response], "prompts": [prompt], "labels": ["42"]})
    assert r.status_code == 200, r.text
    logs = r.json()["extra_logs"]
    # today only "42" (the text after the echoed prompt) is scored: no length penalty, exact match 1.0
    assert logs["len"] == [-1.0], logs
    assert r.json()["rewards"][0] < 1.0


# --- 3. python.function: verl-style functions that return numpy numbers ------------------------------------

def test_python_function_accepts_numpy_numbers_like_verl_does(app_client, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = app_client
    path = tmp_path / "user_reward.py"
    path.write_text(
        "import numpy as np\n"
        "def f32(data_source, solution_str, ground_truth, extra_info=None):\n    return np.float32(1.0)\n"
        "def i64(data_source, solution_str, ground_truth, extra_info=None):\n    return np.int64(1)\n"
        "def dct(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': np.float32(0.5), 'acc': np.float32(1.0)}\n")
    # the pool is started lazily by the first cpu_heavy score, after this, so its processes see it
    monkeypatch.setenv("GRPO_CURATOR_PYTHON_FUNCTIONS", json.dumps(
        {"f32": f"{path}:f32", "i64": f"{path}:i64", "dct": f"{path}:dct"}))
    restart_forkserver()  # pool workers inherit the forkserver's environment: a new one sees this allowlist
    _register(c, {"name": "np", "components": [
        {"name": "a", "kind": "python.function", "params": {"name": "f32"}},
        {"name": "b", "kind": "python.function", "params": {"name": "i64"}},
        {"name": "c", "kind": "python.function", "params": {"name": "dct"}}]})
    r = c.post("/v1/score", json={"reward_spec": "np", "items": [
        {"prompt": "p", "completion": "c", "reference": {"answer": "1"}}]})
    assert r.status_code == 200, r.text
    res = r.json()["results"][0]
    # today: "compute_score(): expected a number, got float32" / "got int64" -> total null
    assert {k: v["value"] for k, v in res["rewards"].items()} == {"a": 1.0, "b": 1.0, "c": 0.5}, res
    assert res["total"] == 2.5
    assert res["rewards"]["c"]["details"] == {"acc": 1.0}  # numpy numbers in the details dict too


# --- 4. DPO export: pairs from groups that are not mixed -----------------------------------------------------

def test_dpo_pairs_come_only_from_mixed_groups(app_client) -> None:
    c, url = app_client
    _register(c, {"name": "dpo", "components": [
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


# --- 5. TRL adapter: functions and weights from one spec version, scoring by another -----------------------

def test_trl_reward_funcs_keep_scoring_with_the_version_their_weights_came_from(service: LiveServer) -> None:
    from integrations import trl

    v1 = {"name": "drift", "components": [
        {"name": "correct", "kind": "verifier.exact_match", "outcome": True, "params": {"extract_pattern": "(\\d+)"}},
        {"name": "fmt", "kind": "rule.format", "weight": 0.5, "params": {"required_tags": ["answer"]}}]}
    assert httpx.post(f"{service.url}/v1/reward-specs", json=v1).status_code == 201
    funcs, weights = trl.reward_funcs("drift", url=service.url)
    assert [f.__name__ for f in funcs] == ["correct", "fmt"] and weights == [1.0, 0.5]
    # mid-run, someone publishes version 2 of the spec (a component renamed)
    v2 = {**v1, "components": [v1["components"][0], {**v1["components"][1], "name": "format"}]}
    assert httpx.post(f"{service.url}/v1/reward-specs", json=v2).status_code == 201
    prompts, completions = ["What is 6*7?"], ["<answer>42</answer>"]
    # today: the unpinned name resolves to v2 at scoring time -> KeyError 'fmt' inside TRL's reward loop
    # (and with the same names but new weights/params, TRL would mix v2 values with v1 weights silently)
    assert [f(prompts=prompts, completions=completions, answer=["42"]) for f in funcs] == [[1.0], [1.0]]


# --- 6. /v1/score store: the group id ignores the sampling budget -------------------------------------------

def test_score_store_same_completion_with_another_max_tokens_is_not_a_409(app_client) -> None:
    c, _ = app_client
    _register(c, {"name": "st", "components": [
        {"name": "len", "kind": "rule.length", "params": {"target": 1, "limit": 10, "unit": "chars"}}]})
    item = {"prompt": "p", "completion": "c", "max_tokens": 100}
    first = c.post("/v1/score", json={"reward_spec": "st", "store": True, "items": [item]})
    assert first.status_code == 200, first.text
    # a second run of the same prompt with a larger budget happens to produce the same text: today the
    # content-hash group id (which leaves out ``sampling``) collides -> 409 and the scores are thrown away
    second = c.post("/v1/score", json={"reward_spec": "st", "store": True, "items": [{**item, "max_tokens": 200}]})
    assert second.status_code == 200, second.text
    assert first.json()["stored_groups"] != second.json()["stored_groups"]
    # one request, two budgets: two groups, each with its own items' budget (not the first item's)
    mixed = c.post("/v1/score", json={"reward_spec": "st", "store": True, "items": [
        {**item, "completion": "a", "max_tokens": 100}, {**item, "completion": "b", "max_tokens": 300},
        {**item, "completion": "c", "max_tokens": 100}]})
    assert mixed.status_code == 200, mixed.text
    budgets = {}
    for gid in mixed.json()["stored_groups"]:
        g = c.get(f"/v1/groups/{gid}").json()
        budgets[g["sampling"].get("max_tokens")] = sorted(t["messages"][-1]["content"] for t in g["trajectories"])
    assert budgets == {100: ["a", "c"], 300: ["b"]}
    # the same request again is idempotent (same ids, nothing new)
    again = c.post("/v1/score", json={"reward_spec": "st", "store": True, "items": [{**item, "max_tokens": 200}]})
    assert again.status_code == 200 and again.json()["stored_groups"] == second.json()["stored_groups"]


# --- 7. import: a verl row whose ground truth is null -----------------------------------------------------

def test_import_verl_row_with_null_ground_truth_is_rejected(client, session, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sqlalchemy import select

    from service.cli import import_prompts as import_cli
    from service.store.models import Prompt

    class Borrowed:
        def __enter__(self):
            return client

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(import_cli, "http_client", lambda url, key: Borrowed())
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ])
    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": "q-missing"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": None}},   # a null cell: the label is missing
            {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "q-ok"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "7"}}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    assert import_cli.main(["prompts", str(path), "--format", "verl"]) == 0
    summary = json.loads(capsys.readouterr().out)
    stored = {p.messages[0]["content"]: p.reference for p in session.scalars(select(Prompt)).all()}
    # today: taken=2 and the prompt is stored with reference {"answer": None}; a row with reward_model=None
    # is rejected as "reward_model.ground_truth: missing", a null ground truth should be too
    assert (summary["taken"], summary["rejected"]) == (1, 1), summary
    assert summary["reasons"] == {"reward_model.ground_truth": 1}
    assert "q-missing" not in stored, stored

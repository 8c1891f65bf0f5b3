"""POST /v1/score and OpenRLHF's remote reward route: real app, real PostgreSQL, real process pool."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.scoring.openrlhf import split_response
from service.store.models import Group
from tests.helpers import register_spec, restart_forkserver

SPEC = {
    "name": "sync-math",
    "components": [
        {"name": "correct", "kind": "verifier.math", "outcome": True},
        {"name": "format", "kind": "rule.format", "weight": 0.5, "params": {"required_tags": ["answer"]}},
    ],
}


@pytest.fixture
def spec(client) -> str:
    assert client.post("/v1/reward-specs", json=SPEC).status_code == 201
    return "sync-math"


R42 = r"<answer>\boxed{42}</answer>"


def item(completion, answer="42", **kw) -> dict:
    return {"prompt": "What is 6 * 7?", "completion": completion, "reference": {"answer": answer}, **kw}


def test_scores_each_item_with_components_and_total(client, spec: str) -> None:
    body = {"reward_spec": spec, "items": [
        item(R42), item(r"\boxed{41}"),
        item([{"role": "assistant", "content": "<answer>\\boxed{42}</answer>"}]),
        {"prompt": [{"role": "user", "content": "x"}], "completion": r"<answer>\boxed{7}</answer>"},  # no reference
    ]}
    r = client.post("/v1/score", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["spec_name"], out["spec_version"]) == ("sync-math", 1)
    right, wrong, chat, unref = out["results"]
    assert (right["total"], right["outcome"]) == (1.5, 1.0)
    assert (wrong["total"], wrong["outcome"]) == (0.0, 0.0)
    assert wrong["rewards"]["format"]["value"] == 0.0
    assert chat["total"] == 1.5
    # an erroring component: null total and outcome, the error named, never 0
    assert unref["total"] is None and unref["outcome"] is None
    assert unref["rewards"]["correct"] == {"value": None, "error": "prompt reference has no 'answer'", "details": {}}
    assert unref["rewards"]["format"]["value"] == 1.0


def test_spec_version_pinned_and_unknown_spec(client, spec: str) -> None:
    client.post("/v1/reward-specs", json={**SPEC, "components": SPEC["components"][:1]})
    old = client.post("/v1/score", json={"reward_spec": f"{spec}@1", "items": [item(R42)]}).json()
    new = client.post("/v1/score", json={"reward_spec": spec, "items": [item(R42)]}).json()
    assert (old["spec_version"], old["results"][0]["total"]) == (1, 1.5)
    assert (new["spec_version"], new["results"][0]["total"]) == (2, 1.0)
    r = client.post("/v1/score", json={"reward_spec": "nope", "items": [item("1")]})
    assert r.status_code == 422 and "reward_spec" in r.json()["error"]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"items": []}, "items"),
        ({"items": [{"prompt": "p"}]}, "items[0].completion"),
        ({"items": [item("1", finish_reason="done")]}, "items[0].finish_reason"),
        ({"items": [item("1", num_tokens=-1)]}, "items[0].num_tokens"),
        ({"items": [item("1", metadata={"x": float("nan")})]}, "items[0]"),
        ({"items": [item("1", extra=1)]}, "items[0].extra"),
        ({"reward_spec": "a@b"}, "reward_spec"),
        ({"items": [item("1", tools=[{"type": "function", "function": {}}])]}, "tools[0]: needs a function name"),
        ({"items": [item("1", tools=[{"name": "f", "parameters": {"type": 3}}])]}, "tools[0] (f): invalid"),
        ({"items": [item("1", tools=[{"name": "f"}] * 129)]}, "items[0].tools"),
        ({"items": [item("1", tools=[{"name": "f", "x": float("inf")}])]}, "items[0].tools"),
    ],
)
def test_bad_input_names_the_field(client, spec: str, patch: dict, field: str) -> None:
    body = {"reward_spec": spec, "items": [item("1")], **patch}
    r = client.post("/v1/score", content=_dumps(body), headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text
    assert field in r.json()["error"]


def _dumps(body: dict) -> str:
    import json

    return json.dumps(body)  # allows NaN, so the service sees it


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_builtin_agent_spec_reads_the_items_tools(client) -> None:
    """``agent-tools`` checks calls against the prompt's tools: an item carries them in ``tools``."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    bad = {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"town": 1}'}}
    completion = [{"role": "assistant", "content": "", "tool_calls": [call, bad]},
                  {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                  {"role": "assistant", "content": "sunny"}]
    body = {"reward_spec": "agent-tools", "items": [
        {"prompt": "Weather in Paris?", "completion": completion, "reference": {"answer": "sunny"}, "tools": WEATHER},
        {"prompt": "Weather in Paris?", "completion": completion, "reference": {"answer": "sunny"}}]}
    with_tools, without = client.post("/v1/score", json=body).json()["results"]
    assert with_tools["rewards"]["tool_calls"]["value"] == 0.5 and with_tools["total"] is not None
    assert without["total"] is None and "no tool definitions" in without["rewards"]["tool_calls"]["error"]


def test_store_keeps_the_items_tools_on_the_prompt(client, session) -> None:
    body = {"reward_spec": "agent-tools", "store": True, "items": [
        {"prompt": "Weather?", "completion": "sunny", "reference": {"answer": "sunny"}, "tools": WEATHER},
        {"prompt": "Weather?", "completion": "sunny", "reference": {"answer": "sunny"}}]}
    first, second = client.post("/v1/score", json=body).json()["stored_groups"]  # other tools: another prompt
    from service.store.models import Prompt

    prompts = [session.scalar(select(Group.prompt_id).where(Group.id == g)) for g in (first, second)]
    assert [session.get(Prompt, p).metadata_.get("tools") for p in prompts] == [WEATHER, None]


def test_item_limit_is_413_and_stores_nothing(client, session, spec: str) -> None:
    limit = client.app.state.settings.max_score_items
    before = session.scalar(select(func.count()).select_from(Group))
    r = client.post("/v1/score", json={"reward_spec": spec, "store": True, "items": [item("1")] * (limit + 1)})
    assert r.status_code == 413 and "items" in r.json()["error"]
    assert session.scalar(select(func.count()).select_from(Group)) == before
    assert client.post("/v1/score", json={"reward_spec": spec, "items": [item("1")] * limit}).status_code == 200


def test_store_records_groups_idempotently(client, spec: str) -> None:
    body = {"reward_spec": spec, "store": True, "policy_version": 3,
            "items": [item(R42), item(r"\boxed{41}"), item(r"<answer>\boxed{9}</answer>", answer="9")]}
    first = client.post("/v1/score", json=body).json()
    assert len(first["stored_groups"]) == 2  # two distinct prompts + references
    assert client.post("/v1/score", json=body).json()["stored_groups"] == first["stored_groups"]
    g = client.get(f"/v1/groups/{first['stored_groups'][0]}").json()
    assert (g["policy_version"], g["status"], len(g["trajectories"])) == (3, "received", 2)
    assert [t["final_answer"] for t in g["trajectories"]] == [R42, r"\boxed{41}"]


def test_store_respects_the_group_size_limit(client, session, spec: str, monkeypatch) -> None:
    monkeypatch.setattr(client.app.state.settings, "max_group_size", 2)
    before = session.scalar(select(func.count()).select_from(Group))
    r = client.post("/v1/score", json={"reward_spec": spec, "store": True, "items": [item(R42)] * 3})
    assert r.status_code == 422 and r.json()["error"].startswith("items: 3 items share one prompt")
    assert session.scalar(select(func.count()).select_from(Group)) == before
    ok = client.post("/v1/score", json={"reward_spec": spec, "store": True, "items": [item(R42)] * 2})
    assert ok.status_code == 200 and len(ok.json()["stored_groups"]) == 1


# --- OpenRLHF ---------------------------------------------------------------------------------------

TEMPLATE = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


def openrlhf_request(responses: list[str], labels: list) -> dict:
    """Shaped as OpenRLHF's remote_rm client sends it: query = prompt + response with special tokens."""
    prompts = [TEMPLATE.format(q="What is 6 * 7?") for _ in responses]
    queries = ["<|endoftext|>" + p + r + "<|im_end|><|endoftext|><|endoftext|>" for p, r in zip(prompts, responses, strict=True)]
    return {"query": queries, "prompts": prompts, "labels": labels}


@pytest.mark.parametrize(
    ("query", "prompt", "response"),
    [
        ("P: x R <|im_end|>", "P: x", (" R", True)),
        ("<pad><pad>P R</s></s>", "P", (" R", True)),
        ("<s>P R</s><pad><pad>", "<s>P", (" R", True)),  # BOS on the prompt, padding after the EOS
        ("P P R<|eot_id|>\n", "P", (" P R", True)),  # the prompt repeated by the policy is its response
        ("P R", "P", (" R", False)),  # no end-of-sequence token: cut off by the generation limit
        ("P R<pad>", "P", (" R", False)),
        ("x P R", "P", None),  # the query must start with the prompt
        ("Q R", "P", None),
        ("R", "", None),
        ("<pad>R", "<pad>", None),
    ],
)
def test_split_response(query: str, prompt: str, response: tuple[str, bool] | None) -> None:
    got = split_response(query, prompt)
    assert (got if got is None else (got.text, got.ended)) == response


def test_openrlhf_route(client, spec: str) -> None:
    body = openrlhf_request([R42, r"<answer>\boxed{41}</answer>", r"no tags \boxed{42}"], ["42", "42", {"answer": "42"}])
    r = client.post(f"/compat/openrlhf/{spec}/get_reward", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rewards"] == out["scores"] == [1.5, 0.5, 1.0]
    assert out["extra_logs"] == {"reward_error": [0.0, 0.0, 0.0], "correct": [1.0, 0.0, 1.0], "format": [1.0, 1.0, 0.0],
                                 "truncated": [0.0, 0.0, 0.0]}


@pytest.mark.parametrize("eos_means_stop", [True, False])
def test_openrlhf_query_without_eos_is_scored_as_truncated(client, spec: str, monkeypatch, eos_means_stop) -> None:
    from service.scoring.openrlhf import _item, split_response

    monkeypatch.setattr(client.app.state.settings, "openrlhf_eos_means_stop", eos_means_stop)
    body = openrlhf_request([R42, R42], ["42", "42"])
    body["query"][1] = body["prompts"][1] + R42  # generation stopped by the token limit: no EOS, no padding
    out = client.post(f"/compat/openrlhf/{spec}/get_reward", json=body).json()
    assert out["rewards"] == [1.5, 1.5]
    assert out["extra_logs"]["truncated"] == [0.0, 1.0 if eos_means_stop else 0.0]
    cut = split_response(body["query"][1], body["prompts"][1])
    assert cut is not None and cut.text == R42
    assert _item("p", cut, "42", eos_means_stop)["finish_reason"] == ("length" if eos_means_stop else "stop")


def test_openrlhf_error_fails_by_default(client, spec: str) -> None:
    body = openrlhf_request([R42, R42], ["42", None])
    r = client.post(f"/compat/openrlhf/{spec}/get_reward", json=body)
    assert r.status_code == 503
    assert "query[1]" in r.json()["error"] and "no 'answer'" in r.json()["error"]


def test_openrlhf_error_value_setting_is_counted(client, spec: str, monkeypatch) -> None:
    settings = client.app.state.settings
    monkeypatch.setattr(settings, "openrlhf_on_error", "value")
    monkeypatch.setattr(settings, "openrlhf_error_value", -1.0)
    body = openrlhf_request([R42, R42], ["42", None])
    out = client.post(f"/compat/openrlhf/{spec}/get_reward", json=body).json()
    assert out["rewards"] == [1.5, -1.0]
    assert out["extra_logs"]["reward_error"] == [0.0, 1.0]
    assert out["extra_logs"]["correct"] == [1.0, -1.0]
    assert out["extra_logs"]["truncated"] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"prompts": None}, "prompts"), ({"prompts": ["p"]}, "prompts"), ({"labels": ["1"]}, "labels"), ({"query": []}, "query")],
)
def test_openrlhf_bad_shapes(client, spec: str, patch: dict, field: str) -> None:
    body = {**openrlhf_request(["a", "b"], ["1", "2"]), **patch}
    r = client.post(f"/compat/openrlhf/{spec}/get_reward", json=body)
    assert r.status_code == 422 and r.json()["error"].startswith(field)


def test_openrlhf_key_in_path_reaches_the_route(client, session, spec: str) -> None:
    from urllib.parse import quote

    from service.auth import keys

    token = keys.create_key(session, "openrlhf", "trainer")  # auth is on from here
    session.commit()  # as `keys create` does (a refused request's rollback must not take the key away)
    body = openrlhf_request([R42], ["42"])
    assert client.post(f"/compat/openrlhf/{spec}/get_reward", json=body).status_code == 401
    assert client.post(f"/compat/openrlhf/key/not-a-key/{spec}/get_reward", json=body).status_code == 401
    r = client.post(f"/compat/openrlhf/key/{quote(token, safe='')}/{spec}/get_reward", json=body)
    assert r.status_code == 200 and r.json()["rewards"] == [1.5]
    assert client.post("/compat/openrlhf/key//get_reward", json=body).status_code == 404


def test_openrlhf_route_with_a_trailing_slash_answers_without_a_redirect(client, session, spec: str) -> None:
    """OpenRLHF's --remote_rm_url is pasted by hand: '.../get_reward/' answers as '.../get_reward' does, with
    the key in the path too (a 307 would send the client to the path without its key)."""
    from urllib.parse import quote

    from service.auth import keys

    token = keys.create_key(session, "openrlhf-slash", "trainer")
    session.commit()
    body = openrlhf_request([R42], ["42"])
    for path in (f"/compat/openrlhf/key/{quote(token, safe='')}/{spec}/get_reward/",
                 f"/compat/openrlhf/key/{quote(token, safe='')}/{spec}/get_reward"):
        r = client.post(path, json=body, follow_redirects=False)
        assert r.status_code == 200 and r.json()["rewards"] == [1.5], (path, r.status_code)
    r = client.post(f"/compat/openrlhf/{spec}/get_reward/", json=body, headers={"authorization": f"Bearer {token}"},
                    follow_redirects=False)
    assert r.status_code == 200 and r.json()["rewards"] == [1.5]
    assert client.post(f"/compat/openrlhf/{spec}/get_reward/", json=body, follow_redirects=False).status_code == 401


def test_path_key_middleware_sets_the_bearer_header() -> None:
    import asyncio

    from service.scoring.path_key import PathKeyMiddleware

    seen: dict = {}

    async def inner(scope, receive, send) -> None:
        seen.update(path=scope["path"], raw=scope["raw_path"], headers=scope["headers"])

    headers = [(b"authorization", b"Bearer forged"), (b"host", b"h")]
    scope = {"type": "http", "path": "/compat/openrlhf/key/k/x/s@2/get_reward",
             "raw_path": b"/compat/openrlhf/key/k%2Fx/s%402/get_reward", "headers": headers}
    asyncio.run(PathKeyMiddleware(inner)(scope, None, None))
    assert seen["path"] == "/compat/openrlhf/s@2/get_reward"
    assert seen["raw"] == b"/compat/openrlhf/s%402/get_reward"
    assert seen["headers"] == [(b"host", b"h"), (b"authorization", b"Bearer k/x")]
    assert scope["path"] == seen["path"]  # rewritten in place: the server's access log sees no key either
    for other in ("/v1/score", "/compat/openrlhf/s/get_reward"):
        seen.clear()
        asyncio.run(PathKeyMiddleware(inner)({"type": "http", "path": other, "raw_path": other.encode(),
                                              "headers": list(headers)}, None, None))
        assert seen["path"] == other and (b"authorization", b"Bearer forged") in seen["headers"]
    # a path under the key prefix that is not a reward route: routed with its key segment masked
    for shape, masked in (("/compat/openrlhf/key/k", "/compat/openrlhf/key/redacted"),
                          ("/compat/openrlhf/key/k/", "/compat/openrlhf/key/redacted/"),
                          ("/compat/openrlhf/%6Bey/k", "/compat/openrlhf/key/redacted")):
        seen.clear()
        asyncio.run(PathKeyMiddleware(inner)({"type": "http", "path": shape, "raw_path": shape.encode(),
                                              "headers": list(headers)}, None, None))
        assert seen["path"] == masked and seen["raw"] == masked.encode()


def test_score_shares_the_in_process_workers_scorer(fresh_db: str) -> None:

    from service.app import create_app

    app = create_app(database_url=fresh_db, start_worker=True)
    with TestClient(app) as c:
        worker = app.state.worker
        for _ in range(100):  # the worker builds its Scorer when its thread starts
            if worker.scorer is not None:
                break
            time.sleep(0.05)
        assert c.post("/v1/reward-specs", json=SPEC).status_code == 201
        r = c.post("/v1/score", json={"reward_spec": "sync-math", "items": [item(R42)]})
        assert r.status_code == 200 and r.json()["results"][0]["total"] == 1.5
        assert app.state.scorer is None  # no second pool was started
        assert ("rule.format", '{"required_tags":["answer"]}') in worker.scorer._components


# --- 1. external.reported: a finite but huge reported value overflows the weighted total ------------------
# Attack: a finite but huge external.reported value overflowed the weighted total: a 500 or a silent null.

def test_score_reported_value_overflowing_the_total_is_a_named_error_not_a_500_or_a_silent_null(app_client) -> None:
    c, _ = app_client
    register_spec(c, {"name": "env1", "components": [
        {"name": "env", "kind": "external.reported", "weight": 2.0, "outcome": True}]})
    register_spec(c, {"name": "env2", "components": [
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


# --- 2. OpenRLHF route: the response is cut at the LAST copy of the prompt ---------------------------------
# Attack: the OpenRLHF route cut the response at the LAST copy of the prompt, so a response repeating it was scored in part.

def test_openrlhf_response_that_repeats_the_prompt_is_scored_whole(app_client) -> None:
    c, _ = app_client
    register_spec(c, {"name": "lenq", "components": [
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
# Attack: a python.function returning numpy numbers (as verl's do) was an error instead of a score.

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
    register_spec(c, {"name": "np", "components": [
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


# --- 6. /v1/score store: the group id ignores the sampling budget -------------------------------------------
# Attack: /v1/score store: the group id ignored the sampling budget, so the same completion with another max_tokens was a 409.

def test_score_store_same_completion_with_another_max_tokens_is_not_a_409(app_client) -> None:
    c, _ = app_client
    register_spec(c, {"name": "st", "components": [
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


def test_openrlhf_query_that_does_not_start_with_its_prompt_is_a_422_naming_it(client, spec: str) -> None:
    """Found by the schema fuzzer: a malformed query was a 503 'could not be scored' (OpenRLHF retries a 5xx
    and re-scores each time); the caller's mistake is a 4xx naming the query."""
    body = openrlhf_request([R42, R42], ["42", "42"])
    body["query"][1] = "something else entirely " + body["query"][1]
    r = client.post(f"/compat/openrlhf/{spec}/get_reward", json=body)
    assert r.status_code == 422 and "query[1]" in r.json()["error"]


def test_the_docs_agent_example_scores_as_written(client) -> None:
    import re

    text = (Path(__file__).resolve().parents[3] / "docs" / "integrations.md").read_text()
    [body] = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S) if '"agent-tools"' in b]
    [result] = client.post("/v1/score", json=body).json()["results"]
    assert result["total"] is not None and result["outcome"] == 1.0
    assert result["rewards"]["tool_calls"]["value"] == 1.0

"""The dashboard's group page for a group of agent sessions, in a real headless Chromium: each session as
its calls (prompt ids, completion ids, finish reason, latency, the error of a failed call) and the tokens
its trajectory trains on, the loss mask's 1s highlighted and exactly those."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import start_server, stop_server
from tests.service.observability.cdp import Browser, find_chromium
from tests.service.sessions.conftest import GATEWAY_ENV
from tests.service.sessions.fake_upstream import COMPLETION_IDS, render
from tests.service.sessions.upstreams import start_fake_vllm, stop

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
USER = [{"role": "user", "content": "add 2 and 3"}]


@pytest.fixture
def browser(tmp_path):
    b = Browser(CHROMIUM, tmp_path / "profile")
    yield b
    b.close()


def _open(url: str, group_id: str) -> dict[str, Any]:
    body = {"group_id": group_id, "group_size": 2, "policy_version": 0, "prompt_id": "dash-agent",
            "prompt": {"dataset": "agents", "messages": USER, "reference": {"answer": "5"}}}
    r = httpx.post(url + "/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _chat(session: dict[str, Any], messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(session["base_url"] + "/chat/completions", json={"model": "fake", "messages": messages},
                      headers={"Authorization": f"Bearer {session['api_key']}"}, timeout=30)


@pytest.fixture
def agent_group(make_db) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any], list[dict[str, Any]]]]:
    """A group of two sessions: one of two answered calls (finished), one whose call found the upstream gone."""
    fake = start_fake_vllm()
    server = start_server(make_db(), env={**GATEWAY_ENV, "GRPO_CURATOR_INFERENCE_URL": fake.url})
    try:
        group_id = f"dash-{uuid.uuid4().hex[:8]}"
        good, bad = _open(server.url, group_id), _open(server.url, group_id)
        first = _chat(good, USER)
        assert first.status_code == 200, first.text
        history = [*USER, {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                   {"role": "user", "content": "go on"}]
        assert _chat(good, history).status_code == 200
        r = httpx.post(good["base_url"] + "/finish", json={},
                       headers={"Authorization": f"Bearer {good['api_key']}"})
        assert r.status_code == 200, r.text
        fake.kill()
        assert _chat(bad, USER).status_code == 502  # the environment's failure: env_error, group complete
        yield server.url, group_id, good, bad, history
    finally:
        stop(fake)
        stop_server(server)


def test_group_page_shows_each_session_as_its_calls_and_its_trained_tokens(browser, agent_group) -> None:
    url, group_id, good, bad, history = agent_group
    g = httpx.get(f"{url}/v1/groups/{group_id}", params={"include_tokens": True}).json()
    (t,) = [t for t in g["trajectories"] if t["metadata"].get("session_id") == good["session_id"]]
    browser.goto(f"{url}/dashboard#group/{group_id}")
    browser.wait_for("document.querySelectorAll('.session').length === 2")
    rows = browser.evaluate(f"""[...document.querySelectorAll('.session[data-session="{good['session_id']}"] table tr')]
      .slice(1).map(r => [...r.children].map(c => c.textContent))""")
    assert [r[0] for r in rows] == ["0", "1"]
    assert [int(r[2]) for r in rows] == [len(render(USER)), len(render(history))]  # prompt ids
    assert [int(r[3]) for r in rows] == [len(COMPLETION_IDS)] * 2 and [r[4] for r in rows] == ["stop", "stop"]
    assert all(r[5].endswith(" ms") for r in rows) and [r[7] for r in rows] == ["", ""]
    failed = browser.evaluate(f"""[...document.querySelectorAll('.session[data-session="{bad['session_id']}"] table tr')]
      .slice(1).map(r => [...r.children].map(c => c.textContent))""")
    assert len(failed) == 1 and "upstream unreachable" in failed[0][7] and failed[0][3] == "0"
    assert "env_error" in browser.evaluate(f"""document.querySelector('.session[data-session="{bad['session_id']}"] h3').textContent""")
    tokens = browser.evaluate(f"""[...document.querySelectorAll('.session[data-session="{good['session_id']}"] .tok')]
      .map(s => [s.textContent, s.classList.contains('trained')])""")
    parts = t["segments"] or [t]  # the fake's template is not prefix-stable: a segment per call
    ids, mask = sum((p["token_ids"] for p in parts), []), sum((p["loss_mask"] for p in parts), [])
    assert [int(text) for text, _ in tokens] == ids and [int(trained) for _, trained in tokens] == mask
    assert 0 < sum(mask) < len(mask)  # both kinds are on the page
    assert browser.errors == [], browser.errors

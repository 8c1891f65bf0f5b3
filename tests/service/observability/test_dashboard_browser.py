"""The dashboard in a real headless Chromium (driven over the DevTools protocol): every page loads with
no console error or failed load, charts have axes, and the transcript of a posted group is shown.
Screenshots land in the test's temp dir. Needs Debian's `chromium` package (skipped without it)."""

from __future__ import annotations

import copy
from urllib.parse import quote

import pytest

from reward_models.scoring import Scorer
from service.api.examples import AGENT_GROUPS, POLICY
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.store.processes import processes_mentioning
from service.worker.pipeline import drain
from tests.helpers import make_group
from tests.service.observability.cdp import Browser, find_chromium

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
AGENT_ID = "agent#1"  # "#" must survive the dashboard's links and fetches


@pytest.fixture
def browser(tmp_path):
    b = Browser(CHROMIUM, tmp_path / "profile")
    yield b
    b.close()
    assert processes_mentioning(str(tmp_path / "profile")) == []  # the browser and its helpers are gone


@pytest.fixture
def populated(live_server):
    groups = copy.deepcopy(AGENT_GROUPS)
    groups["groups"][0]["id"] = AGENT_ID
    with CuratorClient(live_server.url) as c:
        c._json("POST", "/v1/groups", json=groups)
        for v, answers in enumerate((["42", "41", "42", "7"], ["42", "42", "42", "42"], ["1", "42", "9", "42"])):
            c.post_group(make_group(f"g{v}", prompt_id=f"p{v}", answers=answers, policy_version=v))
    with Scorer(processes=1, timeout_s=20) as scorer:
        drain(make_sessionmaker(get_engine(live_server.db_url)), scorer)
    with CuratorClient(live_server.url) as c:
        for version in (1, 2, 4):  # version 3 missing: a gap, not a line
            c._json("POST", "/v1/policy", json={**POLICY, "version": version})
    return live_server


AXES = """(() => { const drawn = [...document.querySelectorAll('.chart svg')].filter(s => s.querySelector('path.series'));
  return drawn.every(s => s.querySelector('.x-axis') && s.querySelector('.y-axis') &&
      s.querySelectorAll('.x-tick').length >= 2 && s.querySelectorAll('.y-tick').length >= 2 &&
      s.querySelector('.x-label').textContent.length > 0) ? drawn.length : -1; })()"""  # charts with a line


def _page(browser, url, ready, shot, tmp_path):
    browser.goto(url)
    value = browser.wait_for(ready)
    browser.screenshot(tmp_path / f"{shot}.png")
    assert (tmp_path / f"{shot}.png").stat().st_size > 5000
    return value


def test_dashboard_pages_in_a_real_browser(browser, populated, tmp_path):
    base = populated.url + "/dashboard"
    cards = _page(browser, base + "#overview", "document.querySelector('#cards') && document.querySelectorAll('.chart').length >= 5 && document.body.innerText", "overview", tmp_path)
    assert "policy version" in cards and "Dropped groups by reason" in cards
    assert browser.evaluate(AXES) >= 4  # truncation has none to draw: "no data yet", not an empty frame
    assert "no data yet" in browser.evaluate("document.querySelector('.grid').textContent")

    # the page renders its tables from separate fetches: wait for the component table too, not only the first
    datasets = _page(browser, base + "#datasets", "document.querySelectorAll('table tr').length > 2 && "
                     "document.body.innerText.includes('correct') && document.body.innerText", "datasets", tmp_path)
    assert "calc" in datasets and "correct" in datasets
    _page(browser, base + "#datasets/toy", "document.querySelectorAll('.chart').length >= 5", "dataset-toy", tmp_path)
    assert browser.evaluate(AXES) >= 3

    _page(browser, base + "#groups", "document.querySelectorAll('a.group-link').length >= 4", "groups", tmp_path)
    links = browser.evaluate("[...document.querySelectorAll('a.group-link')].map(a => a.getAttribute('href'))")
    assert "#group/" + quote(AGENT_ID, safe="") in links
    _page(browser, base + "#groups?status=dropped", "document.querySelector('form.filters') && document.body.innerText", "groups-dropped", tmp_path)
    shown = browser.evaluate("[...document.querySelectorAll('a.group-link')].map(a => a.textContent)")
    with CuratorClient(populated.url) as c:  # the API's answer to the same filter
        dropped = [g["id"] for g in c.list_groups(status="dropped")["groups"]]
    # g1 (all correct: zero variance) is dropped; so is the agent group (drop_reason "untrainable")
    assert "g1" in shown and sorted(shown) == sorted(dropped) and "g0" not in shown

    text = _page(browser, base + "#group/" + quote(AGENT_ID, safe=""), "document.querySelector('.transcript') && document.body.innerText", "transcript", tmp_path)
    assert AGENT_ID in text
    assert "calculator" in text and "12*7" in text and "12 * 7 = 84" in text  # tool call, its arguments, the answer
    assert "tool (c1)" in text.lower() or "TOOL (C1)" in text  # the tool result, tied to its call
    assert "advantage" in text.lower() and "correct" in text  # per-component reward table
    assert "Decision log" in text

    _page(browser, base + "#trainer", "document.querySelectorAll('.chart').length >= 5", "trainer", tmp_path)
    assert browser.evaluate(AXES) >= 4  # loss, KL, entropy, clip fraction (no TIS / staleness metrics posted)
    # the loss chart's line breaks at the missing version 3: two path segments ("M" twice)
    loss = browser.evaluate("document.querySelector('.chart svg path.series').getAttribute('d')")
    assert loss.count("M") == 2, loss
    assert browser.errors == [], browser.errors


def test_a_missing_group_shows_an_error_not_a_blank_page(browser, live_server, tmp_path):
    text = _page(browser, live_server.url + "/dashboard#group/nope", "document.querySelector('#error') && document.body.innerText", "missing", tmp_path)
    assert "404" in text


def test_the_api_docs_page_renders_offline(browser, live_server, tmp_path):
    """/docs draws every operation and the group body's schema from /openapi.json, with nothing from outside."""
    text = _page(browser, live_server.url + "/docs", "document.querySelectorAll('details.op').length > 20 && document.body.innerText", "docs", tmp_path)
    assert "POST" in text and "/v1/groups" in text and "GroupIn" in text
    browser.evaluate("document.querySelectorAll('details.op').forEach(d => d.open = true)")
    body = browser.evaluate("document.body.innerText")
    assert "run7-step12-gsm8k-17" in body  # the example group body is shown
    assert "trajectories" in body and "finish_reason" in body
    assert browser.errors == [], browser.errors


def test_with_auth_on_the_dashboard_shows_a_key_form_and_keeps_the_key_in_the_session(browser, live_server, tmp_path):
    """Auth on (a key exists): the public shell loads, the first data call gets 401 and the page shows a key
    form (no window.prompt, which a headless screenshot cannot answer); the key entered is kept in the
    tab's sessionStorage (not localStorage) and every later call sends it as Bearer."""
    from sqlalchemy.orm import Session

    from service.auth import keys

    engine = get_engine(live_server.db_url)
    with Session(engine) as s, s.begin():
        token = keys.create_key(s, "dash-viewer", "viewer")
    base = live_server.url + "/dashboard"
    browser.goto(base + "#overview")
    browser.wait_for("!!document.querySelector('#key-form')")
    browser.screenshot(tmp_path / "key-form.png")
    browser.evaluate(f"document.getElementById('key-input').value = {token!r};"
                     " document.getElementById('key-form').requestSubmit(); true")
    cards = browser.wait_for("document.querySelector('#cards') && document.body.innerText")
    assert "policy version" in cards and "401" not in cards
    assert browser.dialogs == []
    assert browser.evaluate("sessionStorage.getItem('grpo-curator-api-key')") == token
    assert browser.evaluate("localStorage.getItem('grpo-curator-api-key')") is None
    browser.goto(base + "#groups")
    browser.wait_for("document.querySelector('form.filters') && document.body.innerText")
    assert browser.evaluate("document.querySelector('#key-form')") is None  # kept: not asked again
    assert all("401" in e for e in browser.errors), browser.errors  # only the first, unauthenticated call


# Attack: metrics of +-1.7e308 (finite doubles) overflowed the chart's y range: NaN coordinates, an empty chart.
def test_trainer_view_draws_extreme_but_valid_metric_values_without_errors(live_server, tmp_path):
    """Metrics are free-form JSON numbers. A diverging run that publishes loss 1.7e308 then -1.7e308 (both
    finite doubles) makes the y range overflow to Infinity; every tick and dot gets NaN coordinates and
    Chromium logs 'Error: <circle> attribute cy: Expected length, "NaN"' -- the chart is empty."""
    import httpx
    import pytest

    from tests.service.observability.cdp import Browser, find_chromium

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed")
    for version, loss in ((1, 1.7e308), (2, -1.7e308), (3, 0.5)):
        r = httpx.post(live_server.url + "/v1/policy", json={"version": version, "metrics": {"loss": loss}})
        assert r.status_code == 201, r.text
    browser = Browser(chromium, tmp_path / "profile")
    try:
        browser.goto(live_server.url + "/dashboard#trainer")
        browser.wait_for("document.querySelectorAll('.chart').length >= 5")
        import time

        time.sleep(1)
        browser.screenshot(tmp_path / "trainer-extreme.png")
        assert browser.errors == [], browser.errors[:3]
    finally:
        browser.close()

"""The dashboard's group views in a real headless Chromium: a group page shows its prompt and every member's
action (members of a group dropped as a whole say so, not "no action yet"); the group list has a reward
column; the TIS chart's tick labels are distinct even over a narrow range."""

from __future__ import annotations

import copy
from urllib.parse import quote

import pytest

from reward_models.scoring import Scorer
from service.api.examples import AGENT_GROUPS
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group
from tests.service.observability.cdp import Browser, find_chromium

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


@pytest.fixture
def browser(tmp_path):
    b = Browser(CHROMIUM, tmp_path / "profile")
    yield b
    b.close()


@pytest.fixture
def server(live_server):
    with CuratorClient(live_server.url) as c:
        c._json("POST", "/v1/groups", json=copy.deepcopy(AGENT_GROUPS))  # no token ids: dropped, untrainable
        c.post_group(make_group("mixed", prompt_id="pm", answers=["42", "41", "42", "7"]))
        for version, tis in ((1, 0.00671), (2, 0.00689), (3, 0.0068)):  # a narrow range: 0.0068 three times before
            c._json("POST", "/v1/policy", json={"version": version, "metrics": {"loss": 0.1, "tis_weight": tis}})
    with Scorer(processes=1, timeout_s=20) as scorer:
        drain(make_sessionmaker(get_engine(live_server.db_url)), scorer)
    return live_server


def test_group_page_shows_the_prompt_and_every_members_action(browser, server):
    agent = AGENT_GROUPS["groups"][0]
    with CuratorClient(server.url) as c:
        assert c.get_group(agent["id"])["status"] == "dropped"
    browser.goto(server.url + "/dashboard#group/" + quote(agent["id"], safe=""))
    text = browser.wait_for("document.querySelector('.transcript.prompt') && document.body.innerText")
    assert agent["prompt"]["messages"][0]["content"] in text
    actions = browser.evaluate("[...document.querySelectorAll('.tag.action')].map(t => t.textContent)")
    assert len(actions) == len(agent["trajectories"]) and "no action yet" not in actions
    assert all(a == "drop (group: untrainable)" for a in actions), actions
    browser.goto(server.url + "/dashboard#group/mixed")
    # a hash change re-renders in place: wait for the new group's heading, not a prompt the old page still shows
    browser.wait_for("document.querySelector('h2 code')?.textContent === 'mixed' && !!document.querySelector('.transcript.prompt')")
    actions = browser.evaluate("[...document.querySelectorAll('.tag.action')].map(t => t.textContent)")
    assert len(actions) == 4 and "no action yet" not in actions, actions
    assert browser.errors == [], browser.errors


def test_group_list_has_a_reward_column(browser, server):
    browser.goto(server.url + "/dashboard#groups")
    browser.wait_for("document.querySelectorAll('a.group-link').length >= 2")
    headers = browser.evaluate("[...document.querySelectorAll('table th')].map(h => h.textContent)")
    assert "mean reward" in headers
    col = headers.index("mean reward")
    cells = browser.evaluate(f"[...document.querySelectorAll('table tr')].slice(1).map(r => r.children[{col}].textContent)")
    with CuratorClient(server.url) as c:
        means = [g["mean_reward"] for g in c.list_groups()["groups"]]
    assert all(m is not None for m in means) and len(cells) == len(means)
    assert all(cell not in ("", "–") for cell in cells), cells


def test_tis_ticks_are_distinct_over_a_narrow_range(browser, server):
    browser.goto(server.url + "/dashboard#trainer")
    browser.wait_for("document.querySelectorAll('.chart').length >= 5")
    ticks = browser.evaluate("""[...document.querySelectorAll('.chart svg')]
      .filter(s => s.getAttribute('aria-label').startsWith('TIS'))
      .map(s => [...s.querySelectorAll('.y-tick')].map(t => t.textContent))[0]""")
    assert ticks and len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks

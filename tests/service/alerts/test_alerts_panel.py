"""The dashboard's alerts panel in a real headless Chromium: an open alert with its state, value,
threshold and the evidence series drawn; nothing but "every monitor is ok" without one."""

from __future__ import annotations

import httpx
import pytest

from tests.service.observability.cdp import Browser, find_chromium

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


@pytest.fixture
def browser(tmp_path):
    b = Browser(CHROMIUM, tmp_path / "profile")
    yield b
    b.close()


def test_the_panel_shows_an_open_alert_and_the_series_that_tripped_it(browser, live_server, tmp_path):
    base = live_server.url + "/dashboard#overview"
    browser.goto(base)
    text = browser.wait_for("document.querySelector('#alerts') && document.querySelector('#alerts').innerText")
    assert "0 open" in text and "every monitor is ok" in text
    for v in range(1, 24):
        r = httpx.post(live_server.url + "/v1/policy", json={"version": v, "metrics": {"entropy": 1.0 if v <= 20 else 0.1}})
        assert r.status_code == 201
    assert httpx.post(live_server.url + "/v1/alerts/evaluate").json()["transitions"][0]["to"] == "critical"
    browser.goto(live_server.url + "/dashboard#trainer")
    text = browser.wait_for("document.querySelector('#alerts .alert-row') && document.querySelector('#alerts').innerText")
    assert "1 open" in text and "entropy_collapse" in text and "critical" in text and "overall" in text
    drawn = browser.evaluate("document.querySelectorAll('#alerts .chart svg path.series').length")
    assert drawn == 1  # the entropy series of the evidence window
    browser.screenshot(tmp_path / "alerts.png")
    assert browser.errors == [], browser.errors

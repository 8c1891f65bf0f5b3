"""/metrics, /v1/summary and /dashboard reflect what is stored."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.helpers import make_group


def test_metrics_and_summary_count_groups_by_status(client):
    for i in range(3):
        client.post("/v1/groups", json=make_group(f"m-{i}", prompt_id=f"mp-{i}"))
    summary = client.get("/v1/summary").json()
    assert summary["groups"] == {"received": 3} and summary["policy_version"] == 0
    text = client.get("/metrics").text
    assert 'grpo_curator_groups{status="received"} 3.0' in text
    assert "grpo_curator_policy_version 0.0" in text


def test_dashboard_is_served(client):
    r = client.get("/dashboard")
    assert r.status_code == 200 and "grpo-curator" in r.text and "/dashboard/static/dashboard.js" in r.text
    js = client.get("/dashboard/static/dashboard.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "/v1/stats?by=policy_version" in js.text
    assert client.get("/dashboard/static/..%2Fapp.py").status_code == 404


# Attack: with auth on the dashboard's data fetches sent no Authorization header (every call a 401).
def test_dashboard_sends_a_key_when_auth_is_on(client: TestClient, admin) -> None:
    """Issue: the dashboard asks for a key once and keeps it in the browser. With auth on, its page is
    served (public) but every data call is a plain fetch(path) with no Authorization header -> 401."""
    html = client.get("/dashboard").text
    assert "/dashboard/static/dashboard.js" in html  # the page's script, served (public) with the shell
    script = client.get("/dashboard/static/dashboard.js").text
    assert "Authorization" in script and "Bearer" in script, "the dashboard's fetch() never sends a key"
    # the key flow in a real browser, with auth on: tests/service/observability/test_dashboard_browser.py

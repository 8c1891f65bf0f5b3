"""POST /v1/policy, GET /v1/policy, GET /v1/policy/history: strictly increasing, idempotent retries."""

from __future__ import annotations


class TestPublish:
    def test_nothing_published_reads_as_version_zero(self, client):
        assert client.get("/v1/policy").json() == {"version": 0, "metrics": {}, "created_at": None}
        assert client.get("/v1/policy/history").json() == {"versions": []}

    def test_publish_then_read(self, client):
        r = client.post("/v1/policy", json={"version": 1, "metrics": {"loss": 0.25, "clip_frac": 0.1}})
        assert r.status_code == 201
        body = r.json()
        assert (
            body["version"] == 1
            and body["metrics"] == {"loss": 0.25, "clip_frac": 0.1}
            and body["created_at"]
        )
        assert client.get("/v1/policy").json() == body

    def test_the_same_version_and_metrics_again_is_idempotent(self, client):
        first = client.post("/v1/policy", json={"version": 4, "metrics": {"loss": 1.5}})
        again = client.post("/v1/policy", json={"version": 4, "metrics": {"loss": 1.5}})
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json() == first.json()
        client.post("/v1/policy", json={"version": 5, "metrics": {}})
        old = client.post("/v1/policy", json={"version": 4, "metrics": {"loss": 1.5}})  # a late retry
        assert old.status_code == 200 and old.json() == first.json()

    def test_versions_strictly_increase(self, client):
        client.post("/v1/policy", json={"version": 3, "metrics": {"loss": 1.0}})
        same_other = client.post("/v1/policy", json={"version": 3, "metrics": {"loss": 2.0}})
        assert same_other.status_code == 409 and "version" in same_other.json()["error"]
        lower = client.post("/v1/policy", json={"version": 2, "metrics": {}})
        assert lower.status_code == 409 and "current version 3" in lower.json()["error"]
        assert client.get("/v1/policy").json()["metrics"] == {"loss": 1.0}
        assert [v["version"] for v in client.get("/v1/policy/history").json()["versions"]] == [3]

    def test_history_newest_first_with_limit(self, client):
        for v in (1, 2, 5, 9):
            assert client.post("/v1/policy", json={"version": v, "metrics": {"step": v}}).status_code == 201
        versions = client.get("/v1/policy/history").json()["versions"]
        assert [v["version"] for v in versions] == [9, 5, 2, 1]
        assert [v["metrics"]["step"] for v in versions] == [9, 5, 2, 1]
        assert [
            v["version"] for v in client.get("/v1/policy/history", params={"limit": 2}).json()["versions"]
        ] == [9, 5]


class TestValidation:
    def test_bad_bodies_name_the_field(self, client):
        cases = [
            ({"version": -1, "metrics": {}}, "version"),
            ({"metrics": {}}, "version"),
            ({"version": 1, "metrics": [1, 2]}, "metrics"),
            ({"version": 1, "metric": {}}, "metric"),
        ]
        for body, field in cases:
            r = client.post("/v1/policy", json=body)
            assert r.status_code == 422 and field in r.json()["error"], (body, r.json())

    def test_non_finite_metrics_are_refused(self, client):
        r = client.post(
            "/v1/policy",
            content=b'{"version": 1, "metrics": {"loss": NaN}}',
            headers={"content-type": "application/json"},
        )
        assert r.status_code in (400, 422)
        assert client.get("/v1/policy").json()["version"] == 0

    def test_history_limit_is_bounded(self, client):
        r = client.get("/v1/policy/history", params={"limit": 0})
        assert r.status_code == 422 and "limit" in r.json()["error"]


class TestMonitoredMetricDomains:
    """The metrics the monitors read are validated by their domain (a negative KL or clip fraction would
    average real trouble away): a 422 naming the key, nothing stored; other keys stay free-form."""

    def test_out_of_domain_or_non_numeric_values_are_422_naming_the_key(self, client):
        cases = [
            ("behaviour_kl", -1), ("behaviour_kl", -1e-9), ("kl_ref", -0.2), ("entropy", -5.0),
            ("grad_norm", -1), ("clip_frac_low", -1.0), ("clip_frac_high", 1.5), ("clip_frac_low", 1e308),
            ("behaviour_kl", "0.5"), ("kl_ref", None), ("entropy", True), ("grad_norm", [1.0]),
        ]
        for key, value in cases:
            r = client.post("/v1/policy", json={"version": 1, "metrics": {key: value}})
            assert r.status_code == 422 and f"metrics.{key}" in r.json()["error"], (key, value, r.text)
        r = client.post("/v1/policy", content=b'{"version": 1, "metrics": {"kl_ref": Infinity}}',
                        headers={"content-type": "application/json"})
        assert r.status_code in (400, 422)
        assert client.get("/v1/policy").json()["version"] == 0

    def test_domain_edges_and_other_keys_are_accepted(self, client):
        metrics = {"behaviour_kl": 0.0, "kl_ref": 1.7e308, "entropy": 0, "grad_norm": 0.0, "clip_frac_low": 0.0,
                   "clip_frac_high": 1.0, "loss": -3.5, "note": "free-form"}
        r = client.post("/v1/policy", json={"version": 1, "metrics": metrics})
        assert r.status_code == 201, r.text

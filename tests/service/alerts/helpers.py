"""Synthetic runs through the real API: published trainer metrics and stored groups, then an evaluation."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from unittest import mock

from service.alerts import service as alerts_service
from service.worker.pipeline import run_once
from tests.helpers import make_group, make_trajectory


def publish(api: Any, version: int, **metrics: float) -> None:
    r = api.post("/v1/policy", json={"version": version, "metrics": metrics})
    assert r.status_code == 201, r.text


def evaluate(api: Any) -> list[dict[str, Any]]:
    r = api.post("/v1/alerts/evaluate")
    assert r.status_code == 200, r.text
    return r.json()["transitions"]


def opened(transitions: list[dict[str, Any]]) -> set[tuple[str, str | None, str]]:
    """(monitor, dataset, to-state) of every transition."""
    return {(t["alert"]["monitor"], t["alert"]["dataset"], t["to"]) for t in transitions}


def healthy_metrics(rng: Any) -> dict[str, float]:
    """A healthy trainer step with noise: entropy ~1, KL ~0.02, clip ~0.05, grad norm ~1."""
    m = {
        "entropy": 1.0 + rng.gauss(0, 0.03),
        "kl_ref": max(0.0, 0.02 + rng.gauss(0, 0.002)),
        "clip_frac_low": max(0.0, 0.02 + rng.gauss(0, 0.005)),
        "clip_frac_high": max(0.0, 0.03 + rng.gauss(0, 0.005)),
        "grad_norm": max(0.0, 1.0 + rng.gauss(0, 0.1)),
        "behaviour_mismatch": max(0.0, 0.001 + rng.gauss(0, 0.0002)),
    }
    m["behaviour_kl"] = m["behaviour_mismatch"] / 2  # no draw of its own: the runs' random streams stay as they were
    return m


TEXT_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 "


def text_of(rng: Any, chars: int) -> str:
    """``chars`` characters drawn as ``"".join(rng.choice(TEXT_ALPHABET) for _ in range(chars))`` draws them, the
    same characters and the same stream after, at a third of the cost: ``choice`` over 37 characters is
    ``getrandbits(6)`` redrawn while it is 37 or more (``random.Random._randbelow``)."""
    getrandbits, n, out = rng.getrandbits, len(TEXT_ALPHABET), []
    while len(out) < chars:
        r = getrandbits(6)
        if r < n:
            out.append(TEXT_ALPHABET[r])
    return "".join(out)


def group(gid: str, version: int, answers: list[str], *, lengths: list[int] | None = None,
          texts: list[str] | None = None, reasons: list[str] | None = None, dataset: str = "toy",
          prompt_id: str = "p-1") -> dict[str, Any]:
    """A group sampled at ``version``: answers are scored by the default spec (verifier.math vs 42)."""
    g = make_group(gid, prompt_id=prompt_id, answers=answers, policy_version=version, dataset=dataset)
    trajs = []
    for i, a in enumerate(answers):
        n = (lengths or [6] * len(answers))[i]
        t = make_trajectory(answer=a, response_len=n, seed=i, finish_reason=(reasons or ["stop"] * len(answers))[i])
        content = f"{(texts or [''] * len(answers))[i]} The answer is \\boxed{{{a}}}"
        t["messages"] = [{"role": "assistant", "content": content}]
        trajs.append(t)
    g["trajectories"] = trajs
    g["sampling"] = {"temperature": 1.0, "max_tokens": 4096}
    return g


SPEC = {
    "name": "mon",
    "components": [
        {"name": "correct", "kind": "verifier.math", "weight": 1.0, "outcome": True},
        {"name": "fmt", "kind": "rule.format", "weight": 0.1, "params": {"pattern": "Final answer:", "source": "response"}},
    ],
}


def setup_spec(api: Any) -> None:
    """The synthetic runs' reward spec (a math verifier, the outcome; a format rule) on dataset toy."""
    assert api.post("/v1/reward-specs", json=SPEC).status_code == 201
    assert api.put("/v1/datasets/toy", json={"reward_spec": "mon"}).status_code == 200


def run_versions(api: Any, scorer: Any, last: int, version: Callable[[int], tuple[dict[str, float], Any]],
                 drain_every: int = 1, first: int = 1) -> dict[int, set[tuple[str, str | None, str]]]:
    """A synthetic run through the real API on the synthetic runs' spec: for each version ``first``..``last``,
    ``version(v)`` -> (its trainer metrics, its POST /v1/groups body); publish the metrics, post the groups,
    let the real worker score and curate every ``drain_every`` versions (and at the last: up to
    ``drain_every - 1`` versions are still unscored when evaluated, as with a lagging worker), evaluate after
    every version. {version: the transitions it caused} for the versions that caused any. ``first`` > 1 goes on
with a run whose versions before it are stored already (a copy of a database that ran them: the spec is
there, and the worker had caught up at ``first - 1``).

    The worker runs one pass (``run_once``: claim, score, write + curate, maintenance) per catch-up, and it
    must score every group posted since the last one (its batch, 32, holds them all): what ``drain``'s two
    extra idle passes per catch-up would have confirmed, checked directly. The worker's own scheduled
    evaluation (``evaluate_due``, once per ``alert_evaluate_seconds`` per process) is held off: it would
    take a transition away from the evaluation after the version that caused it (a false "no transition"
    whenever the 30 s schedule fell on a pathology's version); every version is evaluated explicitly."""
    if first == 1:
        setup_spec(api)
    seen: dict[int, set[tuple[str, str | None, str]]] = {}
    pending = 0  # groups posted since the worker's last pass
    with mock.patch.object(alerts_service, "_last_run", [math.inf]):  # never due: see above
        for v in range(first, last + 1):
            metrics, groups = version(v)
            publish(api, v, **metrics)
            r = api.post("/v1/groups", json=groups)
            assert r.status_code in (200, 201), r.text
            pending += len(groups["groups"]) if "groups" in groups else 1
            if v % drain_every == 0 or v == last:
                done = run_once(api.factory, scorer)
                assert (done.scored, done.retried, done.failed, done.fenced) == (pending, 0, 0, 0), \
                    f"version {v}: the worker's pass left groups unscored: {done} of {pending} posted"
                assert done.ready + done.dropped == pending, f"version {v}: not all curated: {done}"
                pending = 0
            if changes := opened(evaluate(api)):
                seen[v] = changes
    return seen

"""A tool misuse is a failed outcome whatever the trajectory answered after it (docs/curation.md, "Actions by
finish_reason"): the outcome component scores 0 and the total is summed with that 0, in ``combine`` and so in
every scoring path (the worker's stage, ``POST /v1/score``, rescore)."""

from __future__ import annotations

import pytest

from reward_models import ComponentResult, RewardSpec, combine
from reward_models.base import PromptInfo, Sample, error_result
from reward_models.scoring import Scorer

SPEC = RewardSpec(name="s", components=[
    {"name": "m", "kind": "verifier.exact_match", "outcome": True},
    {"name": "fmt", "kind": "rule.turns", "weight": 0.5, "params": {"max_turns": 4}},
])


def ok(value: float) -> ComponentResult:
    return ComponentResult(value=value, details={"why": "matched"})


def test_a_misuse_scores_a_failed_outcome_whatever_it_answered() -> None:
    right = {"m": ok(1.0), "fmt": ok(1.0)}
    assert combine(SPEC, right, "stop").outcome == 1.0
    scored = combine(SPEC, right, "tool_misuse")
    assert scored.outcome == 0.0 and scored.total == pytest.approx(0.5)  # the other components still count
    details = scored.components["m"].details
    assert details["value"] == 1.0 and details["why"] == "matched" and "tool_misuse" in details["failed_outcome"]


@pytest.mark.parametrize("reason", ["stop", "length", "max_turns", "tool_failure", "env_error", None])
def test_no_other_reason_changes_the_outcome(reason: str | None) -> None:
    assert combine(SPEC, {"m": ok(1.0), "fmt": ok(0.0)}, reason).outcome == 1.0


def test_a_misuse_whose_verifier_could_not_score_is_still_failed() -> None:
    scored = combine(SPEC, {"m": error_result("judge down"), "fmt": ok(0.0)}, "tool_misuse")
    assert scored.outcome == 0.0 and scored.total == 0.0


def test_the_scorer_passes_each_samples_finish_reason() -> None:
    prompt = PromptInfo(messages=[], reference={"answer": "5"}, metadata={}, dataset="d")

    def sample(reason: str) -> Sample:
        return Sample(messages=[{"role": "assistant", "content": "5"}], final_answer="5", finish_reason=reason,
                      num_tokens=1, num_turns=1)

    with Scorer() as scorer:
        stop, misuse = scorer.score(SPEC, [(sample("stop"), prompt), (sample("tool_misuse"), prompt)])
    assert stop.outcome == 1.0 and misuse.outcome == 0.0


@pytest.mark.parametrize("components", [
    # no outcome component: success reported by the environment (an agent spec)
    [{"name": "env", "kind": "external.reported", "weight": 1.0}],
    # a second component grading the answer beside the outcome
    [{"name": "m", "kind": "verifier.exact_match", "outcome": True, "weight": 0.5},
     {"name": "math", "kind": "verifier.math", "weight": 0.5}],
])
def test_no_component_that_grades_the_answer_pays_a_misuse(components: list[dict]) -> None:
    """Attack: only the outcome component was zeroed, so a spec without one (or with a second answer-grading
    component) paid a misuse session its reward (total 1.0, or 0.5 over a clean wrong answer's 0.0)."""
    spec = RewardSpec(name="agent", components=components)
    right = {c["name"]: ok(1.0) for c in components}
    assert combine(spec, right, "stop").total == pytest.approx(1.0)
    scored = combine(spec, right, "tool_misuse")
    assert scored.total == 0.0
    assert all(r.value == 0.0 and r.details["value"] == 1.0 for r in scored.components.values())

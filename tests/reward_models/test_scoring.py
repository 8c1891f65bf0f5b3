"""Scorer: a spec over many samples, heavy components in the killable pool, from any thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from reward_models import RewardSpec, ScoredSample, Scorer
from tests.reward_models.helpers import make_prompt, make_sample

SPEC = RewardSpec(
    name="math-r1",
    components=[
        {"name": "correct", "kind": "verifier.math", "outcome": True},
        {"name": "format", "kind": "rule.format", "weight": 0.2, "params": {"required_tags": ["answer"]}},
        {
            "name": "overlong",
            "kind": "rule.overlong",
            "weight": 0.5,
            "params": {"max_tokens": 100, "buffer": 20},
        },
    ],
)
# sympy evaluates this power tower when comparing: it never finishes (a real math-verify blow-up)
BLOW_UP = r"<answer>$\boxed{9^{9^{9^{9}}}}$</answer>"


@pytest.fixture(scope="module")
def scorer() -> Iterator[Scorer]:
    with Scorer(processes=2, timeout_s=2.0) as s:
        yield s


def items(*answers: str, tokens: int = 10) -> list:
    return [(make_sample(a, num_tokens=tokens), make_prompt({"answer": "42"})) for a in answers]


def test_scores_and_totals(scorer: Scorer) -> None:
    right, wrong, unformatted = scorer.score(
        SPEC, items(r"<answer>$\boxed{42}$</answer>", r"<answer>$\boxed{41}$</answer>", "42")
    )
    assert (right.outcome, right.total) == (1.0, pytest.approx(1.2))
    assert (wrong.outcome, wrong.total) == (0.0, pytest.approx(0.2))
    assert (unformatted.outcome, unformatted.total) == (1.0, pytest.approx(1.0))
    assert right.components["correct"].details == {"extracted": "42"}
    [long] = scorer.score(SPEC, items(r"<answer>$\boxed{42}$</answer>", tokens=90))
    assert long.total == pytest.approx(1.0 + 0.2 + 0.5 * -0.5)


def test_math_blow_up_is_a_verification_timeout_fail_and_the_rest_still_scores(scorer: Scorer) -> None:
    results = scorer.score(SPEC, items(BLOW_UP, r"<answer>$\boxed{42}$</answer>"))
    stuck, fine = results
    correct = stuck.components["correct"]
    # the same verifier checked its canary within the deadline: the answer is what was slow -> a fail
    assert (correct.value, correct.error) == (0.0, None)
    assert correct.details["reason"] == "verification_timeout" and correct.details["timeout_s"] == 2.0
    assert stuck.outcome == 0.0 and stuck.total == pytest.approx(0.2)  # format still counts
    assert fine.outcome == 1.0


def test_a_verifier_that_misses_its_canary_too_is_an_error_not_a_fail() -> None:
    with Scorer(processes=1, timeout_s=0.001) as sick:  # nothing verifies in 1 ms: the verifier is at fault
        [stuck] = sick.score(SPEC, items(BLOW_UP))
    correct = stuck.components["correct"]
    assert correct.value is None and correct.details == {"reason": "verifier_unhealthy"}
    assert correct.error.startswith("timeout after 0.001s; canary also timed out")
    assert stuck.total is None and stuck.outcome is None  # never a silent 0


def test_scoring_off_the_main_thread(scorer: Scorer) -> None:
    out: list[list[ScoredSample]] = []
    thread = threading.Thread(target=lambda: out.append(scorer.score(SPEC, items(r"$\boxed{42}$", BLOW_UP))))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    [[ok, stuck]] = out
    assert ok.outcome == 1.0
    assert stuck.components["correct"].details["reason"] == "verification_timeout"


def test_components_are_cached_per_kind_and_params(scorer: Scorer) -> None:
    a = scorer.component("rule.overlong", {"max_tokens": 100, "buffer": 20})
    b = scorer.component("rule.overlong", {"buffer": 20, "max_tokens": 100})
    c = scorer.component("rule.overlong", {"max_tokens": 100, "buffer": 10})
    assert a is b and a is not c


def test_empty_input_and_bad_arguments(scorer: Scorer) -> None:
    assert scorer.score(SPEC, []) == []
    with pytest.raises(ValueError, match="processes"):
        Scorer(processes=0)
    with pytest.raises(ValueError, match="timeout_s"):
        Scorer(timeout_s=0)


def test_spec_without_heavy_components_starts_no_pool() -> None:
    spec = RewardSpec(name="em", components=[{"name": "em", "kind": "verifier.exact_match"}])
    with Scorer() as scorer:
        [scored] = scorer.score(spec, items("42"))
        assert scored.total == 1.0 and scored.outcome == 1.0
        assert scorer._pool is None


@pytest.mark.parametrize(("task", "args"), [("die", ()), ("allocate", (2048,))])
def test_an_answer_that_crashes_its_verifier_is_a_fail_when_the_canary_passes(scorer: Scorer, task, args) -> None:
    """A worker that dies on an answer (a segfault, the memory limit) while the same component verifies its
    canary in the same pool is the answer's doing: 0 with the reason, never a null the policy could seek."""
    from reward_models.pool import KillablePool
    from reward_models.scoring import _collect, params_key
    from tests.reward_models import tasks

    with KillablePool(1, memory_mb=1024) as pool:
        crashed = _collect(pool.submit(getattr(tasks, task), *args, timeout_s=30))
    [result] = scorer._attribute("verifier.math", params_key({}), [crashed])
    assert (result.value, result.error) == (0.0, None)
    assert result.details["reason"] == "verifier_crashed"


def test_a_crash_with_a_failing_canary_is_the_verifiers_error() -> None:
    from reward_models.pool import KillablePool
    from reward_models.scoring import _collect, attribute_timeout
    from tests.reward_models import tasks

    with KillablePool(1) as pool:
        crashed = _collect(pool.submit(tasks.die, timeout_s=30))
    result = attribute_timeout(crashed, 2.0, healthy=False, canary="canary failed: worker crashed")
    assert result.value is None and result.details == {"reason": "verifier_unhealthy"}
    assert result.error.startswith("worker crashed: exit code -9; canary failed")

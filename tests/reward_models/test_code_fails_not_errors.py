"""verifier.code: a wrong answer is a fail (0), never "could not score"; errors are ours or the reference's.

Issue 19, "Wrong answers that become could-not-score": the work the trusted tests do on the program's
results runs on the task's clock in the harness sandbox and counts against the program; what the
program may return can go back to it as an argument; a program that leaves a mess in io mode does not
break the next case; and verifier.code has a canary, so a pool timeout is attributed, not an error.
Real programs through the real component and the Scorer's pool.
"""

from __future__ import annotations

from reward_models import RewardSpec, Scorer, make_component
from reward_models.scoring import canary_in_worker, params_key
from tests.reward_models.helpers import make_prompt, make_sample

PARAMS = {"timeout_s": 2.0, "memory_mb": 256}


def spec(**params: object) -> RewardSpec:
    return RewardSpec(
        name="code",
        components=[{"name": "code", "kind": "verifier.code", "outcome": True, "params": {**PARAMS, **params}}],
    )


def pooled(answer: str, reference: dict, **params: object):
    """Through the Scorer's KillablePool (where a hung harness meets the pool's deadline)."""
    with Scorer(processes=1, timeout_s=2.0) as scorer:
        (scored,) = scorer.score(spec(**params), [(make_sample(answer), make_prompt(reference))])
    return scored.components["code"]


def score(answer: str, reference: dict, **params: object):
    component = make_component("verifier.code", {**PARAMS, **params})
    return component.score(make_sample(answer), make_prompt(reference))


def test_verifier_code_has_a_canary_that_passes() -> None:
    result = canary_in_worker("verifier.code", params_key(PARAMS))
    assert result.error is None, result.error
    assert result.value == 1.0


def test_hash_colliding_ints_the_tests_put_in_a_set_are_a_fail() -> None:
    answer = "def f():\n    return [k * (2**61 - 1) for k in range(1, 100_001)]\n"
    result = pooled(answer, {"tests": "assert len(set(f())) == 1\n"})
    assert result.error is None, result.error
    assert result.value == 0.0 and result.details["verdict"] == "timeout", result.details


def test_a_huge_int_the_tests_square_is_a_fail() -> None:
    answer = "def f():\n    return (1 << 63_000_000) - 1\n"
    result = pooled(answer, {"tests": "x = f()\nassert x * x > x\n"})
    assert result.error is None, result.error
    assert result.value == 0.0 and result.details["verdict"] == "timeout", result.details


DEEP = (
    "def f():\n    v = []\n    for _ in range(64):\n        v = [v]\n    return v\n"
    "def depth(v):\n    d = 0\n    while v:\n        v, d = v[0], d + 1\n    return d\n"
)


def test_what_the_program_returns_can_be_passed_back_to_it() -> None:
    result = score(DEEP, {"tests": "v = f()\nassert depth(v) == 64\nassert depth(v=v) == 64\n"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


def test_a_result_nested_deeper_than_the_cap_is_a_fail() -> None:
    answer = DEEP.replace("range(64)", "range(65)")
    result = score(answer, {"tests": "assert depth(f()) == 65\n"})
    assert result.error is None, result.error
    assert result.value == 0.0 and "not plain data" in result.details["reason"]


TREE = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
IO = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4", "output": "6"}, {"input": "0 0", "output": "0"}]


def test_io_program_building_a_deep_tree_does_not_break_the_next_case_or_task() -> None:
    result = score(TREE + SUM, {"io": IO})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details  # right answers; the tree was wiped
    wrong = score(TREE + "print(0)\n", {"io": IO})
    assert wrong.error is None and wrong.value == 0.0, (wrong.error, wrong.details)
    assert score(SUM, {"io": IO}).value == 1.0


def test_tests_that_hang_before_calling_the_program_are_a_reference_error() -> None:
    result = score("def f():\n    return 1\n", {"tests": "while True:\n    pass\n"}, timeout_s=1.0)
    assert result.value is None and "reference" in (result.error or ""), (result.error, result.details)


def test_tests_that_exit_the_harness_after_a_call_are_a_fail() -> None:
    tests = "import os\nv = f()\nos._exit(0)\n"  # no verdict after the program's result arrived
    assert score("def f():\n    return 1\n", {"tests": tests}).value == 0.0
    passed = score("def f():\n    return 2\n", {"tests": "assert f() == 2\n"})
    assert passed.value == 1.0, passed.details


def test_results_the_tests_pass_back_wrapped_or_doubled_are_a_fail_not_an_error() -> None:
    wrapped = score(DEEP, {"tests": "v = f()\nassert depth([v]) == 65\n"})  # 65 deep on the way back
    assert wrapped.error is None and wrapped.value == 0.0, (wrapped.error, wrapped.details)
    big = "def f():\n    return 'x' * (9 << 20)\ndef size(s):\n    return len(s)\n"
    doubled = score(big, {"tests": "s = f()\nassert size(s + s) == 18 << 20\n"}, timeout_s=10.0)
    assert doubled.error is None and doubled.value == 0.0, (doubled.error, doubled.details)
    assert "could not pass the program's results back" in doubled.details["reason"]


def test_a_program_that_spends_the_time_before_the_tests_reach_it_is_a_fail() -> None:
    answer = "import time\ntime.sleep(1.6)\ndef f():\n    return 1\n"
    result = score(answer, {"tests": "import time\ntime.sleep(0.6)\nassert f() == 1\n"})
    assert result.error is None, result.error
    assert result.value == 0.0 and result.details["verdict"] == "timeout", result.details

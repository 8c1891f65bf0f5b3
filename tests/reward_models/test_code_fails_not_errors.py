"""verifier.code: a wrong answer is a fail (0), never "could not score"; errors are ours or the reference's.

Issue 19, "Wrong answers that become could-not-score": the work the trusted tests do on the program's
results runs on the task's clock in the harness sandbox and counts against the program; what the
program may return can go back to it as an argument; a program that leaves a mess in io mode does not
break the next case; and verifier.code has a canary, so a pool timeout is attributed, not an error.
Real programs through the real component and the Scorer's pool.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from reward_models import RewardSpec, Scorer, make_component
from reward_models.code_harness import run_function_tests
from reward_models.sandbox import SandboxLimits, checkout
from reward_models.sandbox_backend import SandboxError
from reward_models.sandbox_settings import SandboxSettings
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


# --- what the supervisor parses of the program is bounded, and its cost is the program's -----------------

LISTING_BOMB = r"""
import socket, struct, time
body = b'{"defined":[' + b'{},' * ((16 * 2**20 - 40) // 3) + b'0]}'
socket.socket(fileno=3).sendall(struct.pack('>I', len(body)) + body)  # its own first frame: 5.6M objects
time.sleep(30)
"""


def test_a_listing_the_supervisor_cannot_afford_to_parse_is_a_fail() -> None:
    with Scorer(processes=1, timeout_s=5.0, memory_mb=650) as scorer:
        item = (make_sample(LISTING_BOMB), make_prompt({"tests": "assert f(1) == 2\n"}))
        (scored,) = scorer.score(spec(timeout_s=5.0), [item])
    result = scored.components["code"]
    assert result.error is None, result.error
    assert result.value == 0.0 and "limit" in result.details["reason"], result.details


def test_a_correct_program_with_many_imported_names_still_passes() -> None:
    modules = ("os", "math", "string", "itertools", "socket", "typing", "re")
    stars = "".join(f"from {m} import *\n" for m in modules)
    helpers = "".join(f"def helper_{i}(x):\n    return x\n" for i in range(500))
    result = score(stars + helpers + "def f(x):\n    return x + 1\n", {"tests": "assert f(1) == 2\n"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


# --- the tests killed from outside while the program had not answered: an error ---------------------------


def _task_child(pid: int) -> int | None:
    """The deepest process below ``pid`` (bubblewrap -> zygote -> the task's child), host view."""
    deepest, todo = (0, None), [(pid, 0)]
    while todo:
        current, depth = todo.pop()
        deepest = max(deepest, (depth, current), key=lambda d: d[0])
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    todo += [(int(p), depth + 1) for p in fh.read().split()]
        except OSError:
            pass
    return deepest[1] if deepest[0] >= 2 else None


def _threads(pid: int | None) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task")) if pid else 0
    except OSError:
        return 0


SLOW = (
    "import threading, time\ndef f(x):\n"
    "    threading.Thread(target=time.sleep, args=(2,)).start()\n    time.sleep(2)\n    return x + 1\n"
)


def test_tests_killed_from_outside_while_the_program_computes_are_an_error_not_a_fail() -> None:
    settings = SandboxSettings()
    with checkout(settings) as sandbox, checkout(settings, role="harness") as harness:
        outcome: dict = {}

        def run() -> None:
            try:
                limits = SandboxLimits(timeout_s=20.0)
                tests = "assert f(1) == 2\n"
                outcome["value"] = run_function_tests(sandbox, limits, SLOW, tests, None, None, harness)
            except Exception as exc:  # noqa: BLE001 - what it raised is the result
                outcome["value"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        while thread.is_alive() and _threads(_task_child(sandbox.proc.pid)) < 2:
            threading.Event().wait(0.01)  # until the program started its thread: the call is with it
        tests = _task_child(harness.proc.pid)
        assert tests is not None and thread.is_alive()
        os.kill(tests, signal.SIGKILL)  # the machine, not the program, ends the tests
        thread.join()
    assert isinstance(outcome["value"], SandboxError), outcome["value"]
    assert "killed (signal 9)" in str(outcome["value"])
    assert score("def f(x):\n    return x + 1\n", {"tests": "assert f(1) == 2\n"}).value == 1.0


# --- a reference that raises before any result of the program reached it: its error, not the program's ----

CORRECT = "def f(x):\n    return x + 1\n"


@pytest.mark.parametrize(
    ("tests", "says"),
    [
        ("import numpy\nassert f(1) == 2\n", "only the standard library"),
        ("x = [0] * 10**10\nassert f(1) == 2\n", "ran out of memory"),
        ("cases = {}\nassert f(cases['one']) == 2\n", "KeyError"),
        ("def check(candidate):\n    assert candidate(1) == 2\nrun_it = check\nrun_it(f, 1)\n", "TypeError"),
    ],
)
def test_tests_that_raise_before_calling_a_correct_program_are_a_reference_error(
    tests: str, says: str
) -> None:
    result = score(CORRECT, {"tests": tests})
    assert result.value is None and "reference" in (result.error or ""), (result.error, result.details)
    assert says in result.error


@pytest.mark.parametrize(
    ("answer", "tests"),
    [
        (CORRECT, "assert 1 == 2, 'a check of the tests own'\nassert f(1) == 2\n"),
        ("def g(x):\n    return x + 1\n", "assert f(1) == 2\n"),  # the program did not define f
        ("f = 2\n", "assert f(1) == 2\n"),  # not as a function
    ],
)
def test_an_assertion_or_a_missing_program_function_before_any_call_stays_a_fail(
    answer: str, tests: str
) -> None:
    result = score(answer, {"tests": tests})
    assert result.error is None, result.error
    assert result.value == 0.0, result.details

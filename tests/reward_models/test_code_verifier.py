"""verifier.code: verdicts of honest programs, the three modes, params and errors (attacks: test_code_attacks)."""

from __future__ import annotations

import pytest

from reward_models import make_component
from reward_models.base import ComponentResult
from reward_models.code_harness import normalize_output
from reward_models.sandbox_settings import get_sandbox_settings
from reward_models.text import extract_code
from tests.reward_models.helpers import make_prompt, make_sample

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
FAST = {"timeout_s": 3.0, "memory_mb": 256}  # generous: a busy CI machine must not turn passes into timeouts


def run_code(
    answer: str, tests: str | None = TESTS, reference: dict | None = None, **params: object
) -> ComponentResult:
    component = make_component("verifier.code", {**FAST, **params})
    ref = reference if reference is not None else {"tests": tests}
    return component.score(make_sample(answer), make_prompt(ref))


def test_correct_code_passes_and_wrong_code_fails() -> None:
    passed = run_code("```python\ndef add(a, b):\n    return a + b\n```")
    assert passed.value == 1.0 and passed.details["verdict"] == "passed"
    assert passed.details["isolation"] == "bubblewrap" and passed.details["calls"] == 2
    failed = run_code("```python\ndef add(a, b):\n    return a - b\n```")
    assert failed.value == 0.0 and failed.details["verdict"] == "failed"
    assert failed.details["reason"].startswith("AssertionError (tests line 1)")


def test_last_fenced_block_else_whole_answer() -> None:
    answer = "First try:\n```python\ndef add(a, b): return 0\n```\nFixed:\n```python\ndef add(a, b): return a + b\n```"
    assert extract_code(answer).strip() == "def add(a, b): return a + b"
    assert run_code(answer).value == 1.0
    assert run_code("def add(a, b):\n    return a + b").value == 1.0


@pytest.mark.parametrize(
    ("answer", "reference", "value"),
    [
        ("def add(a, b): return a + b", {"tests": CHECK, "entry_point": "add"}, 1.0),
        ("def plus(a, b): return a + b", {"tests": CHECK, "entry_point": "plus"}, 1.0),
        ("def plus(a, b): return a + b", {"tests": CHECK, "entry_point": "add"}, 0.0),  # entry point missing
        ("def plus(a, b): return a + b", {"tests": CHECK}, 1.0),  # the only function is the candidate
        ("def f(a, b): return a + b\ndef g(): pass", {"tests": CHECK}, 0.0),  # ambiguous without entry_point
        ("def add(a, b): return a * b", {"tests": CHECK, "entry_point": "add"}, 0.0),
    ],
)
def test_check_candidate_and_entry_points(answer: str, reference: dict, value: float) -> None:
    assert run_code(answer, reference=reference).value == value


def test_helpers_from_the_prompt_are_callable_from_the_tests() -> None:
    answer = "def double(x):\n    return 2 * x\ndef quad(x):\n    return double(double(x))\n"
    tests = "assert double(3) == 6\nassert quad(3) == 12\n"
    assert run_code(answer, tests).value == 1.0


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**100),
        1.5,
        float("inf"),
        -0.0,
        2 + 3j,
        "é\x00",
        b"\x00\xff",
        [1, [2]],
        (1, (2,)),
        {1: "a", (1, 2): frozenset({3})},
        {1, 2},
        frozenset(),
    ],
)
def test_plain_data_results_cross_exactly(value: object) -> None:
    answer = f"from math import inf\ndef f():\n    return {value!r}\n"
    tests = f"v = f()\nassert type(v).__name__ == {type(value).__name__!r} and repr(v) == {repr(value)!r}\n"
    assert run_code(answer, tests).value == 1.0


def test_arguments_cross_with_their_types_and_kwargs() -> None:
    answer = "def f(a, *, b):\n    return [type(a).__name__, type(b).__name__, a, b]\n"
    tests = "assert f((1, 2), b={3}) == ['tuple', 'set', (1, 2), {3}]\n"
    assert run_code(answer, tests).value == 1.0


def test_candidate_exceptions_reach_the_tests_as_builtin_classes() -> None:
    answer = "def div(a, b):\n    if b == 0:\n        raise ValueError('b is zero')\n    return a // b\n"
    tests = "try:\n    div(1, 0)\n    raise AssertionError('no error')\nexcept ValueError as e:\n    assert str(e) == 'b is zero'\n"
    assert run_code(answer, tests).value == 1.0
    custom = "class Oops(Exception):\n    pass\ndef div(a, b):\n    raise Oops('x')\n"
    result = run_code(custom, "div(1, 2)\n")
    assert result.value == 0.0 and "CandidateError" in result.details["reason"]


def test_syntax_error_and_import_time_error_are_fails() -> None:
    syntax = run_code("def add(a, b) return a + b")
    assert syntax.value == 0.0 and "SyntaxError" in syntax.details["reason"]
    boom = run_code("raise RuntimeError('at import')")
    assert boom.value == 0.0 and "RuntimeError: at import" in boom.details["reason"]


def test_infinite_loop_times_out_as_a_fail_or_an_error() -> None:
    looped = run_code("def add(a, b):\n    while True:\n        pass\n", timeout_s=1.0)
    assert looped.value == 0.0 and looped.details["verdict"] == "timeout"
    as_error = run_code("import time\ntime.sleep(60)\n", timeout_s=1.0, on_timeout="error")
    assert as_error.value is None and as_error.error == "timeout after 1.0s"


def test_sandbox_is_reused_and_clean_after_each_task() -> None:
    leave = "import os\nopen('/tmp/left-behind', 'w').write('x')\nopen('here', 'w').write('x')\ndef add(a, b): return a + b\n"
    assert run_code(leave).value == 1.0
    look = (
        "import os\ndef add(a, b):\n    return a + b + len(os.listdir('/tmp')) - 2 + len(os.listdir('.'))\n"
    )
    assert run_code(look).value == 1.0  # /tmp holds only the fresh work dir and the output file


def test_output_tail_is_kept_and_truncated() -> None:
    result = run_code("print('x' * 100_000)\ndef add(a, b): return a + b\n", max_output_bytes=1000)
    assert result.value == 1.0
    assert len(result.details["output"]) < 1100 and result.details["output"].startswith("[truncated]")


IO = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4", "output": "6"}]
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.mark.parametrize(
    ("answer", "verdict", "reason"),
    [
        (SUM, "passed", ""),
        (SUM + "print()\n", "passed", ""),  # trailing blank lines are ignored
        (
            "import sys\na, b = map(int, sys.stdin.read().split())\nsys.stdout.write(f'{a+b}   \\n')\n",
            "passed",
            "",
        ),
        ("print(3)\n", "failed", "wrong output"),
        ("print('3')\nimport sys\nsys.exit(0)\n", "failed", "wrong output"),  # right on case 0 only
        (SUM + "raise SystemExit(2)\n", "failed", "exited with status 2"),
        (SUM + "1 / 0\n", "failed", "exited with status 1"),
        ("while True:\n    print('y' * 1000)\n", "failed", "wrote more than"),
        ("import time\ntime.sleep(30)\n", "timeout", "time limit"),
    ],
)
def test_stdin_stdout_cases(answer: str, verdict: str, reason: str) -> None:
    result = run_code(answer, reference={"io": IO}, timeout_s=2.0)
    assert result.details["verdict"] == verdict and reason in result.details["reason"]
    assert result.value == (1.0 if verdict == "passed" else 0.0)


def test_big_input_and_output_stream_through() -> None:
    numbers = " ".join(str(i) for i in range(200_000))
    io = [{"input": numbers, "output": "\n".join(str(2 * i) for i in range(200_000))}]
    answer = "import sys\nprint('\\n'.join(str(2 * int(x)) for x in sys.stdin.read().split()))\n"
    assert run_code(answer, reference={"io": io}, timeout_s=10.0).value == 1.0


def test_normalize_output_sweeps_whitespace_edges() -> None:
    assert normalize_output("1 \n2\t\n\n\n") == normalize_output("1\n2") == "1\n2"
    assert normalize_output(" 1") != normalize_output("1")  # leading spaces count
    assert normalize_output("") == normalize_output("\n\n")


def test_unittest_tests_run_in_the_harness_with_their_exit_code() -> None:
    tests = (
        "import unittest\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
        "    def test_raises(self):\n        with self.assertRaises(ZeroDivisionError):\n            add(1, 0)\n"
        "unittest.main()\n"
    )
    answer = "def add(a, b):\n    if b == 0:\n        1 / 0\n    return a + b\n"
    assert run_code(answer, tests).value == 1.0
    assert run_code("def add(a, b): return a * 3", tests).value == 0.0


def test_trusted_tests_in_process_mode_is_explicit() -> None:
    tests = "import unittest\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
    tests += "unittest.main(argv=['t'], exit=False)\nassert add(1, 1) == 2\n"
    ok = run_code("def add(a, b): return a + b", tests, mode="trusted_tests_in_process")
    assert ok.value == 1.0 and ok.details["mode"] == "trusted_tests_in_process"
    assert run_code("def add(a, b): return a * 3", tests, mode="trusted_tests_in_process").value == 0.0
    assert make_component("verifier.code", {}).params.mode == "harness"


@pytest.mark.parametrize(
    "reference",
    [
        {},
        {"answer": "1"},
        {"io": []},
        {"io": [{"input": 1, "output": "x"}]},
        {"io": "1 2"},
        {"tests": TESTS, "entry_point": "a b"},
        {"tests": "def check(:\n"},
    ],
)
def test_unusable_references_are_errors_not_zeros(reference: dict) -> None:
    result = run_code("def add(a, b): return a + b", reference=reference)
    assert result.value is None and result.error


def test_tests_passing_non_plain_arguments_are_a_reference_error() -> None:
    result = run_code("def f(g): return 1", "f(lambda: 1)\n")
    assert result.value is None and "not plain data" in (result.error or "")


@pytest.mark.parametrize("param", ["allow_network", "allow_subprocess", "backend", "isolation", "tmpfs_mb"])
def test_sandbox_weakening_params_are_rejected_naming_the_param(param: str) -> None:
    with pytest.raises(
        ValueError, match=f"param '{param}'.*deployment setting.*GRPO_CURATOR_SANDBOX_{param.upper()}"
    ):
        make_component("verifier.code", {param: True})


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": 601}, "timeout_s"),
        ({"memory_mb": 1}, "memory_mb"),
        ({"mode": "fast"}, "mode"),
        ({"max_processes": 0}, "max_processes"),
        ({"colour": 1}, "colour"),
    ],
)
def test_bad_params_name_the_param(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"param '{name}'"):
        make_component("verifier.code", params)


def test_missing_backend_refuses_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_CURATOR_SANDBOX_BWRAP", "/nonexistent/bwrap")
    get_sandbox_settings.cache_clear()
    try:
        result = run_code("def add(a, b): return a + b")
    finally:
        monkeypatch.delenv("GRPO_CURATOR_SANDBOX_BWRAP")
        get_sandbox_settings.cache_clear()
    assert result.value is None
    assert "bubblewrap" in (result.error or "") and "apt-get install bubblewrap" in (result.error or "")
    assert "GRPO_CURATOR_SANDBOX_BACKEND=none" in (result.error or "")

"""The harness's rules for function-style tests, each case a program that broke an earlier version.

Correct programs must pass (big ints, memoized or decorated entry points, a __main__ block), wrong ones must
fail however they return (StopIteration, control-flow exceptions, rigging the prompt's helpers, hash
collisions): real programs through the real component (bubblewrap sandboxes, the harness sandbox).
Each case reproduces an attack of the second round on verifier.code (docs/sandbox.md, "Attack findings").
"""

from __future__ import annotations

import time

import pytest

from reward_models import RewardSpec, Scorer, make_component
from tests.reward_models.helpers import make_prompt, make_sample


def score(answer: str, reference: dict, **params: object):
    component = make_component("verifier.code", {"timeout_s": 5.0, "memory_mb": 256, **params})
    return component.score(make_sample(answer), make_prompt(reference))



# --- correct solutions that fail -------------------------------------------------------------------


# Attack (verifier.code, round 2) broke this: correct solution returning a big int passes
def test_correct_solution_returning_a_big_int_passes() -> None:
    """Finding 1: JSON ints go through decimal text, capped at 4300 digits (Python >= 3.11); the
    sandbox's json.dumps raised and a correct 4772-digit answer scored 0. Big ints now cross as hex."""
    result = score("def big(n):\n    return n ** 10000\n", {"tests": "assert big(3) == 3 ** 10000\n"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


# Attack (verifier.code, round 2) broke this: tests passing a big int argument are not blamed on the program
def test_tests_passing_a_big_int_argument_are_not_blamed_on_the_program() -> None:
    """Finding 2: the harness's own encoding failure of a 4772-digit argument was blamed on the
    program ("malformed message"); it now crosses as hex, and the sandbox lifts the digit cap for the
    program (its own CPU time)."""
    result = score(
        "def digits(n):\n    return len(str(n))\n", {"tests": "assert digits(3 ** 10000) == 4772\n"}
    )
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


# Attack (verifier.code, round 2) broke this: memoized entry point is a function
def test_memoized_entry_point_is_a_function() -> None:
    """Finding 3: @functools.lru_cache / @cache make the entry point a non-FunctionType callable,
    which the sandbox did not list: a correct memoized solution 'did not define fib()'."""
    answer = (
        "import functools\n@functools.lru_cache(maxsize=None)\n"
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    )
    tests = "def check(candidate):\n    assert candidate(10) == 55\n    assert candidate(30) == 832040\n"
    result = score(answer, {"tests": tests, "entry_point": "fib"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details
    result = score(answer, {"tests": "assert fib(10) == 55\n"})  # MBPP style, no entry point
    assert result.details["verdict"] == "passed", result.details


# Attack (verifier.code, round 2) broke this: main guard does not run in function mode
def test_main_guard_does_not_run_in_function_mode() -> None:
    """Finding 4: the program was exec'd as __main__, so its demo block ran at definition time and
    input() on /dev/null failed a correct solution. Function mode now uses __name__ == 'solution'."""
    answer = (
        "def add(a, b):\n    return a + b\n\n"
        "if __name__ == '__main__':\n    a, b = map(int, input().split())\n    print(add(a, b))\n"
    )
    result = score(answer, {"tests": "assert add(2, 3) == 5\n"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


# --- wrong programs that pass / escape their 0 ---------------------------------------------------


# Attack (verifier.code, round 2) broke this: candidate stop iteration does not end the tests iteration
def test_candidate_stop_iteration_does_not_end_the_tests_iteration() -> None:
    """Finding 5: a candidate's StopIteration, re-raised in the trusted tests as itself, silently
    ended map() so all(map(...)) was True. Only data exceptions are re-created now."""
    tests = "cases = [((2, 3), 5), ((1, 1), 2)]\nassert all(map(lambda c: add(*c[0]) == c[1], cases))\n"
    result = score("def add(a, b):\n    raise StopIteration\n", {"tests": tests})
    assert result.error is None, result.error
    assert result.details["verdict"] == "failed", result.details


HELPER_TESTS = (
    "def check(candidate):\n    from random import randint, choice\n    import copy, string\n"
    "    letters = string.ascii_lowercase\n"
    "    for _ in range(20):\n        s = ''.join(choice(letters) for _ in range(randint(10, 20)))\n"
    "        encoded_str = encode_shift(copy.deepcopy(s))\n"
    "        assert candidate(copy.deepcopy(encoded_str)) == s\n"
)
HELPER_PROMPT = (
    "def encode_shift(s: str):\n"
    '    return "".join([chr(((ord(ch) + 5 - ord("a")) % 26) + ord("a")) for ch in s])\n\n\n'
    "def decode_shift(s: str):\n"
    '    """takes as input string encoded with encode_shift function. Returns decoded string."""\n'
)


# Attack (verifier.code, round 2) broke this: program cannot rig the prompts helper
def test_program_cannot_rig_the_prompts_helper() -> None:
    """Finding 6 (HumanEval/50, also /38 and /32): the tests call a helper the *prompt* defines and
    the harness used the program's definition, so encode_shift = decode_shift = identity passed. The
    trusted reference.prompt is exec'd in the harness and its definitions win."""
    rigged = "def encode_shift(s: str):\n    return s\n\ndef decode_shift(s: str):\n    return s\n"
    component = make_component("verifier.code", {"timeout_s": 5.0, "memory_mb": 256})
    prompt = make_prompt(
        {"tests": HELPER_TESTS, "entry_point": "decode_shift", "prompt": HELPER_PROMPT},
        messages=[{"role": "user", "content": "Complete the function:\n```python\n" + HELPER_PROMPT + "```"}],
    )
    result = component.score(make_sample(rigged), prompt)
    assert result.error is None, result.error
    assert result.details["verdict"] == "failed", result.details


# --- isolation between tasks / limits ------------------------------------------------------------

# Attack (verifier.code, round 2) broke this: hash colliding sets are a fail not an error
def test_hash_colliding_sets_are_a_fail_not_an_error() -> None:
    """Finding 8: rebuilding sets of 20,000 ints with one hash (k * (2**61 - 1)) costs ~11 s each in
    the trusted harness; with the deadline checked only after decoding the pool worker was killed
    and a wrong program scored an error instead of 0. Decoding now watches the task's deadline."""
    answer = (
        "import json, struct, sys, time\n"
        "def f():\n"
        "    sock = sys._getframe(1).f_locals['sock']  # the zygote's run_fn: the program owns the protocol\n"
        "    one = '{\"s\":[' + ','.join(str((2**61 - 1) * k) for k in range(1, 20001)) + ']}'\n"
        "    body = ('{\"value\":{\"l\":[' + ','.join([one] * 3) + ']}}').encode()\n"
        "    sock.sendall(struct.pack('>I', len(body)) + body)  # built as text: costs the program nothing\n"
        "    time.sleep(60)\n"
    )
    spec = RewardSpec(
        name="code",
        components=[
            {
                "name": "code",
                "kind": "verifier.code",
                "outcome": True,
                "params": {"timeout_s": 1.0, "memory_mb": 256},
            }
        ],
    )
    start = time.monotonic()
    with Scorer(processes=1, timeout_s=2.0) as scorer:
        (scored,) = scorer.score(spec, [(make_sample(answer), make_prompt({"tests": "assert f() == []\n"}))])
    result = scored.components["code"]
    assert result.error is None, (result.error, round(time.monotonic() - start, 1))
    assert result.value == 0.0


DECORATED = (
    "import functools\nfrom math import sqrt\n"
    "def logged(fn):\n    @functools.wraps(fn)\n    def inner(*a):\n        return fn(*a)\n    return inner\n"
    "@logged\ndef hyp(a, b):\n    return sqrt(a * a + b * b)\n"
)


CHECK_HYP = "def check(candidate):\n    assert candidate(3, 4) == 5.0\n"


# Attack (verifier.code, round 2) broke this: decorated entry point passes and imports are not candidates
def test_decorated_entry_point_passes_and_imports_are_not_candidates() -> None:
    decorated = score(DECORATED, {"tests": CHECK_HYP, "entry_point": "hyp"})
    assert decorated.details["verdict"] == "passed", decorated.details
    ambiguous = score(DECORATED, {"tests": CHECK_HYP})  # logged() and hyp(): the program wrote two
    assert ambiguous.details["verdict"] == "failed" and "entry point" in ambiguous.details["reason"]
    imports = "from math import sqrt, hypot\nfrom functools import reduce\ndef hyp(a, b):\n    return sqrt(a * a + b * b)\n"
    one = score(imports, {"tests": CHECK_HYP})  # imported callables do not make it ambiguous
    assert one.details["verdict"] == "passed", one.details
    assert score(imports, {"tests": "assert hypot(3, 4) == 5.0\n"}).details["verdict"] == "passed"


# Attack (verifier.code, round 2) broke this: control flow exceptions never reach the tests as themselves
@pytest.mark.parametrize(
    "raised", ["StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "AssertionError"]
)
# Attack (verifier.code, round 2) broke this: control flow exceptions never reach the tests as themselves
def test_control_flow_exceptions_never_reach_the_tests_as_themselves(raised: str) -> None:
    answer = f"def add(a, b):\n    raise {raised}\n"
    tests = (
        "cases = [((2, 3), 5), ((1, 1), 2)]\n"
        "assert all(map(lambda c: add(*c[0]) == c[1], cases))\n"
        "assert next(filter(lambda c: add(*c[0]) != c[1], iter(cases)), None) is None\n"
    )
    result = score(answer, {"tests": tests})
    assert result.details["verdict"] == "failed" and "CandidateError" in result.details["reason"], (
        result.details
    )


# Attack (verifier.code, round 2) broke this: prompt helpers the program does not redefine still work and a broken prompt is an error
def test_prompt_helpers_the_program_does_not_redefine_still_work_and_a_broken_prompt_is_an_error() -> None:
    solution = (
        "def decode_shift(s: str):\n    return ''.join(chr(((ord(c) - 5 - 97) % 26) + 97) for c in s)\n"
    )
    ok = score(solution, {"tests": HELPER_TESTS, "entry_point": "decode_shift", "prompt": HELPER_PROMPT})
    assert ok.details["verdict"] == "passed", ok.details
    broken = score(solution, {"tests": HELPER_TESTS, "entry_point": "decode_shift", "prompt": "def f(:\n"})
    assert broken.error is not None and "reference.prompt" in broken.error
    wrong_type = score(solution, {"tests": HELPER_TESTS, "entry_point": "decode_shift", "prompt": 3})
    assert wrong_type.error is not None and "reference.prompt" in wrong_type.error


STUB_PROMPT = 'def double(x):\n    return 2 * x\n\n\ndef quad(x):\n    """double(double(x))"""\n'


# Attack (verifier.code, round 2) broke this: prompt stubs come from the program complete helpers from the prompt
@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ("def double(x):\n    return 2 * x\ndef quad(x):\n    return double(double(x))\n", "passed"),
        ("def quad(x):\n    return 4 * x\n", "passed"),  # the prompt's double() serves the tests
        ("def double(x):\n    return 4 * x\ndef quad(x):\n    return 2 * x\n", "failed"),  # rigged helper
        ("def quad(x):\n    return 0\n", "failed"),
    ],
)
# Attack (verifier.code, round 2) broke this: prompt stubs come from the program complete helpers from the prompt
def test_prompt_stubs_come_from_the_program_complete_helpers_from_the_prompt(
    answer: str, verdict: str
) -> None:
    tests = "for x in range(-3, 4):\n    assert quad(double(x)) == 8 * x\n"  # no entry point: MBPP style
    result = score(answer, {"tests": tests, "prompt": STUB_PROMPT})
    assert result.error is None, result.error
    assert result.details["verdict"] == verdict, result.details

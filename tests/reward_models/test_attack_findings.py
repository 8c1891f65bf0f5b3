"""Regression tests for the second attack round on verifier.code (docs/sandbox.md, "Attack findings").

Each of the nine findings broke the verifier before its fix (a correct program scored 0, a wrong one
passed, a program pinned memory past its limit or escaped its 0). Real programs through the real
component (bubblewrap sandbox, trusted harness), one through the Scorer's KillablePool; no mocks.
"""

from __future__ import annotations

import time

import pytest

from reward_models import RewardSpec, Scorer, make_component
from reward_models.code_harness import run_function_tests
from reward_models.plaindata import (
    MAX_HASHED,
    DecodeTimeout,
    PlainDataError,
    dumps,
    from_plain,
    loads,
    to_plain,
)
from reward_models.sandbox import SandboxLimits, checkout
from reward_models.sandbox_settings import SandboxSettings
from tests.reward_models.helpers import make_prompt, make_sample


def score(answer: str, reference: dict, **params: object):
    component = make_component("verifier.code", {"timeout_s": 5.0, "memory_mb": 256, **params})
    return component.score(make_sample(answer), make_prompt(reference))


# --- correct solutions that fail -------------------------------------------------------------------


def test_correct_solution_returning_a_big_int_passes() -> None:
    """Finding 1: JSON ints go through decimal text, capped at 4300 digits (Python >= 3.11); the
    sandbox's json.dumps raised and a correct 4772-digit answer scored 0. Big ints now cross as hex."""
    result = score("def big(n):\n    return n ** 10000\n", {"tests": "assert big(3) == 3 ** 10000\n"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


def test_tests_passing_a_big_int_argument_are_not_blamed_on_the_program() -> None:
    """Finding 2: the harness's own encoding failure of a 4772-digit argument was blamed on the
    program ("malformed message"); it now crosses as hex, and the sandbox lifts the digit cap for the
    program (its own CPU time)."""
    result = score(
        "def digits(n):\n    return len(str(n))\n", {"tests": "assert digits(3 ** 10000) == 4772\n"}
    )
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


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

SHM_LEAK = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
def leak():
    made = 0
    for i in range(6):
        sid = libc.shmget(0x5EED0000 + i, 32 << 20, 0o1666)  # IPC_CREAT | 0666, 32 MiB each
        if sid < 0:
            continue
        addr = libc.shmat(sid, None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            continue
        ctypes.memset(addr, 0x41, 32 << 20)  # touch it: real memory
        libc.shmdt(ctypes.c_void_p(addr))
        made += 1
    return made
"""
SHM_PROBE = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def probe():
    found = 0
    for i in range(6):
        sid = libc.shmget(0x5EED0000 + i, 0, 0)
        if sid >= 0:
            found += 1
            libc.shmctl(sid, 0, None)  # IPC_RMID: do not leave it on the test machine
    return found
"""


def test_sysv_shared_memory_neither_exceeds_the_limit_nor_outlives_the_task() -> None:
    """Finding 7: every task of a warm sandbox shares the zygote's IPC namespace; a program with
    memory_mb=64 pinned 6 x 32 MiB of SysV shared memory that survived it and that the next sample
    found. The seccomp filter now refuses shmget / semget / msgget / mq_open (EPERM)."""
    leak = score(SHM_LEAK, {"tests": "made = leak()\nassert made == 0, made\n"}, memory_mb=64)
    assert leak.error is None, leak.error
    probe = score(SHM_PROBE, {"tests": "found = probe()\nassert found == 0, found\n"}, memory_mb=64)
    assert probe.error is None, probe.error
    assert probe.details["verdict"] == "passed", (leak.details["reason"], probe.details["reason"])


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


def test_memory_backed_files_count_against_the_memory_limit() -> None:
    """Finding 9 (mitigated, no memory cgroup): RLIMIT_AS does not see shmem written but never
    mapped; with memory_mb=64 a program held 20 memfds x 15 MiB. memfd_create is refused now; files
    in /tmp stay bounded by the tmpfs size (GRPO_CURATOR_SANDBOX_TMPFS_MB), see docs/sandbox.md."""
    answer = (
        "import os\n"
        "def f():\n"
        "    fds, chunk = [], b'A' * (1 << 20)\n"
        "    try:\n"
        "        for _ in range(20):\n"
        "            fd = os.memfd_create('x')\n"
        "            for _ in range(15):\n"
        "                os.write(fd, chunk)\n"
        "            fds.append(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "    return sum(os.fstat(fd).st_size for fd in fds) >> 20\n"
    )
    result = score(answer, {"tests": "held = f()\nassert held <= 64, held\n"}, memory_mb=64)
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details["reason"]  # i.e. it could not hold > 64 MiB


# --- the mechanisms behind the fixes, edge by edge -------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [2**64 - 1, 2**64, -(2**64) + 1, -(2**64), 3**10000, -(7**9000), [{2**70: (2**90,)}]],
    ids=lambda v: f"bits{v.bit_length()}" if type(v) is int else "nested",
)
def test_ints_of_any_size_round_trip(value: object) -> None:
    encoded = to_plain(value)
    assert loads(dumps(value)) == value
    if type(value) is int and abs(value) >= 2**64:
        assert set(encoded) == {"i"}  # hex, never a decimal JSON number


@pytest.mark.parametrize("body", ["", "-", "1_0", " 1f", "0x1f", "zz", 12])
def test_malformed_big_ints_are_refused(body: object) -> None:
    with pytest.raises(PlainDataError):
        from_plain({"i": body})


def test_hashed_entries_are_capped_per_message_not_per_container() -> None:
    half = {"s": list(range(MAX_HASHED // 2 + 1))}
    assert len(from_plain(half)) == MAX_HASHED // 2 + 1
    with pytest.raises(PlainDataError, match="one message"):
        from_plain({"l": [half, half]})


def test_decoding_stops_at_the_deadline() -> None:
    colliding = {"s": [(2**61 - 1) * k for k in range(1, 5001)]}
    with pytest.raises(DecodeTimeout):
        from_plain(colliding, deadline=time.monotonic() - 1.0)
    with pytest.raises(DecodeTimeout):
        from_plain({"l": list(range(1000))}, deadline=time.monotonic() - 1.0)
    assert len(from_plain(colliding, deadline=time.monotonic() + 60.0)) == 5000


DECORATED = (
    "import functools\nfrom math import sqrt\n"
    "def logged(fn):\n    @functools.wraps(fn)\n    def inner(*a):\n        return fn(*a)\n    return inner\n"
    "@logged\ndef hyp(a, b):\n    return sqrt(a * a + b * b)\n"
)


CHECK_HYP = "def check(candidate):\n    assert candidate(3, 4) == 5.0\n"


def test_decorated_entry_point_passes_and_imports_are_not_candidates() -> None:
    decorated = score(DECORATED, {"tests": CHECK_HYP, "entry_point": "hyp"})
    assert decorated.details["verdict"] == "passed", decorated.details
    ambiguous = score(DECORATED, {"tests": CHECK_HYP})  # logged() and hyp(): the program wrote two
    assert ambiguous.details["verdict"] == "failed" and "entry point" in ambiguous.details["reason"]
    imports = "from math import sqrt, hypot\nfrom functools import reduce\ndef hyp(a, b):\n    return sqrt(a * a + b * b)\n"
    one = score(imports, {"tests": CHECK_HYP})  # imported callables do not make it ambiguous
    assert one.details["verdict"] == "passed", one.details
    assert score(imports, {"tests": "assert hypot(3, 4) == 5.0\n"}).details["verdict"] == "passed"


@pytest.mark.parametrize(
    "raised", ["StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "AssertionError"]
)
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


PROBE_KEEPERS = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def keepers():
    out = {}
    for name, call in (("shmget", lambda: libc.shmget(0, 4096, 0o1600)), ("semget", lambda: libc.semget(0, 1, 0o1600)),
                       ("msgget", lambda: libc.msgget(0, 0o1600)), ("mq_open", lambda: libc.mq_open(b"/q", 0o100 | 2, 0o600, None)),
                       ("memfd_create", lambda: libc.memfd_create(b"x", 0))):
        ctypes.set_errno(0)
        out[name] = call() < 0 and ctypes.get_errno() == 1  # EPERM
    return out
"""


@pytest.mark.parametrize("allow_subprocess", [False, True])
def test_ipc_objects_and_memfds_are_refused_under_every_setting(allow_subprocess: bool) -> None:
    tests = "assert keepers() == dict.fromkeys(['shmget', 'semget', 'msgget', 'mq_open', 'memfd_create'], True), keepers()\n"
    with checkout(SandboxSettings(allow_subprocess=allow_subprocess)) as sandbox:
        outcome = run_function_tests(
            sandbox, SandboxLimits(timeout_s=5.0, memory_mb=256), PROBE_KEEPERS, tests, None
        )
    assert outcome.verdict == "passed", outcome.reason


def test_tmp_files_are_bounded_by_the_tmpfs() -> None:
    answer = (
        "import os\ndef fill():\n    chunk, total = b'A' * (1 << 20), 0\n"
        "    for i in range(64):\n        try:\n"
        "            with open(f'/tmp/f{i}', 'wb') as fh:\n                for _ in range(15):\n"
        "                    fh.write(chunk)\n                    total += 1\n"
        "        except OSError:\n            break\n    return total\n"
    )
    tmpfs_mb = SandboxSettings().tmpfs_mb
    result = score(answer, {"tests": f"assert fill() <= {tmpfs_mb}\n"}, max_file_mb=16, timeout_s=20.0)
    assert result.details["verdict"] == "passed", result.details


STUB_PROMPT = 'def double(x):\n    return 2 * x\n\n\ndef quad(x):\n    """double(double(x))"""\n'


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ("def double(x):\n    return 2 * x\ndef quad(x):\n    return double(double(x))\n", "passed"),
        ("def quad(x):\n    return 4 * x\n", "passed"),  # the prompt's double() serves the tests
        ("def double(x):\n    return 4 * x\ndef quad(x):\n    return 2 * x\n", "failed"),  # rigged helper
        ("def quad(x):\n    return 0\n", "failed"),
    ],
)
def test_prompt_stubs_come_from_the_program_complete_helpers_from_the_prompt(
    answer: str, verdict: str
) -> None:
    tests = "for x in range(-3, 4):\n    assert quad(double(x)) == 8 * x\n"  # no entry point: MBPP style
    result = score(answer, {"tests": tests, "prompt": STUB_PROMPT})
    assert result.error is None, result.error
    assert result.details["verdict"] == verdict, result.details

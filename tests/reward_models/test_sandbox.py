"""The sandbox below the component: plain data, backends, settings, process cleanup, the worker pool."""

from __future__ import annotations

import math
import os
import threading
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reward_models import RewardSpec, Scorer
from reward_models.code_harness import run_function_tests
from reward_models.plaindata import PlainDataError, dumps, from_plain, loads, to_plain
from reward_models.sandbox import Sandbox, SandboxLimits, checkout
from reward_models.sandbox_backend import BackendUnavailable, SandboxError, describe_backend, resolve_backend
from reward_models.sandbox_settings import SandboxSettings
from tests.reward_models.helpers import make_prompt, make_sample, processes_with

LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=256)

hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.binary() | st.floats(allow_nan=False),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=8,
)
plain = st.recursive(
    hashables | st.complex_numbers(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(hashables, inner, max_size=3)
        | st.sets(hashables, max_size=3)
    ),
    max_leaves=20,
)


def same(a: object, b: object) -> bool:
    """Equal, with the same types all the way down (and -0.0 kept apart from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)  # type: ignore[attr-defined,index]
    if isinstance(a, (float, complex)):
        return repr(a) == repr(b)
    return a == b


@given(plain)
def test_plain_data_round_trips_with_exact_types(value: object) -> None:
    assert same(loads(dumps(value)), value)


@pytest.mark.parametrize(
    "value",
    [type("I", (int,), {})(1), object(), print, [1, lambda: 1], {"k": type("S", (str,), {})("x")}, range(3)],
)
def test_non_plain_values_are_refused(value: object) -> None:
    with pytest.raises(PlainDataError):
        to_plain(value)


@pytest.mark.parametrize(
    "raw",
    [
        b"[1, 2]",
        b'{"l": 1}',
        b'{"x": []}',
        b'{"s": [{"l": []}]}',
        b'{"d": [[{"l": []}, 1]]}',
        b'{"b": "zz"}',
        b'{"l": [], "t": []}',
        b"\xff",
        b"1" * 5000,
        b'{"l": ' * 100 + b"[]" + b"}" * 100,
        b"[" * 100_000,
    ],
)
def test_malformed_plain_data_is_refused(raw: bytes) -> None:
    with pytest.raises(PlainDataError):
        loads(raw)


def test_depth_cap_applies_both_ways() -> None:
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(PlainDataError, match="deeper"):
        to_plain(deep)
    assert from_plain(to_plain(float("nan"))) != from_plain(to_plain(float("nan")))  # NaN stays NaN
    assert math.isnan(loads(dumps(float("nan"))))


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_CURATOR_SANDBOX_BACKEND", "none")
    monkeypatch.setenv("GRPO_CURATOR_SANDBOX_ALLOW_SUBPROCESS", "true")
    settings = SandboxSettings()
    assert settings.backend == "none" and settings.allow_subprocess and not settings.allow_network
    monkeypatch.setenv("GRPO_CURATOR_SANDBOX_BACKEND", "unshare")
    with pytest.raises(ValueError, match="backend"):
        SandboxSettings()


def test_missing_bubblewrap_is_never_a_silent_fallback() -> None:
    settings = SandboxSettings(bwrap="/nonexistent/bwrap")
    with pytest.raises(BackendUnavailable, match="apt-get install bubblewrap"):
        resolve_backend(settings)
    assert describe_backend(settings).startswith("unavailable:")
    assert describe_backend(SandboxSettings()).startswith("bubblewrap")


def test_unsafe_none_backend_only_when_asked_and_says_so() -> None:
    settings = SandboxSettings(backend="none")
    assert "UNSAFE" in describe_backend(settings)
    with checkout(settings) as sandbox:
        outcome = run_function_tests(
            sandbox, LIMITS, "def add(a, b): return a + b", "assert add(1, 2) == 3\n", None
        )
        assert sandbox.backend.name == "none (unsafe)"
    assert outcome.verdict == "passed"


def _zygote_children(sandbox: Sandbox) -> list[int]:
    """Host pids of the processes under the zygote (bwrap's child)."""

    def children(pid: int) -> list[int]:
        found = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(p) for p in fh.read().split()]
        return found

    zygotes = children(sandbox.proc.pid)
    return [c for z in zygotes for c in children(z)]


def test_double_fork_setsid_process_is_gone_after_the_task() -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"  # a unique sleep duration to find it by
    program = (
        "import os, subprocess\n"
        "def add(a, b):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        f"            os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n"
        "        os._exit(0)\n"
        "    while True:\n"
        "        pass\n"
    )
    with checkout(SandboxSettings(allow_subprocess=True)) as sandbox:
        outcome = run_function_tests(sandbox, SandboxLimits(timeout_s=1.0), program, "add(1, 2)\n", None)
        assert outcome.verdict == "timeout"
        assert processes_with(marker) == [] and _zygote_children(sandbox) == []
        again = run_function_tests(
            sandbox, LIMITS, "def add(a, b): return a + b", "assert add(1, 2) == 3\n", None
        )
        assert again.verdict == "passed"


def test_subprocesses_need_the_deployment_setting() -> None:
    program = "import subprocess\ndef run():\n    return subprocess.run(['/usr/bin/echo', 'hi'], capture_output=True).stdout\n"
    tests = "assert run() == b'hi\\n'\n"
    with checkout(SandboxSettings(allow_subprocess=True)) as sandbox:
        assert run_function_tests(sandbox, LIMITS, program, tests, None).verdict == "passed"
    with checkout(SandboxSettings()) as sandbox:
        assert run_function_tests(sandbox, LIMITS, program, tests, None).verdict == "failed"


def test_a_dead_sandbox_is_replaced() -> None:
    with checkout(SandboxSettings()) as sandbox:
        first = sandbox
        sandbox.proc.kill()
        sandbox.proc.wait()
    with checkout(SandboxSettings()) as sandbox:
        assert sandbox is not first and sandbox.alive()
        assert (
            run_function_tests(sandbox, LIMITS, "def f(): return 1", "assert f() == 1\n", None).verdict
            == "passed"
        )


def test_scorer_pool_runs_code_with_the_components_own_deadline() -> None:
    spec = RewardSpec(
        name="code",
        components=[
            {"name": "tests", "kind": "verifier.code", "params": {"timeout_s": 4.0}, "outcome": True}
        ],
    )
    slow = "import time\ndef add(a, b):\n    time.sleep(1.5)\n    return a + b\n"
    answers = [slow, "def add(a, b): return a - b", "def add(a, b): return a + b", "import os\nos._exit(0)"]
    items = [(make_sample(a), make_prompt({"tests": "assert add(2, 3) == 5\n"})) for a in answers]
    with Scorer(
        processes=2, timeout_s=1.0
    ) as scorer:  # shorter than the slow program: the component's deadline wins
        results = scorer.score(spec, items)
    assert [r.outcome for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert results[0].components["tests"].details["isolation"] == "bubblewrap"


def test_sandbox_dying_under_a_task_is_an_error_not_a_fail() -> None:
    program = "import time\ndef add(a, b):\n    time.sleep(10)\n"
    with pytest.raises(SandboxError, match="stopped answering"):
        with checkout(SandboxSettings()) as sandbox:
            threading.Timer(0.5, sandbox.proc.kill).start()  # the infrastructure fails, not the program
            run_function_tests(sandbox, SandboxLimits(timeout_s=5.0), program, "add(1, 2)\n", None)


@pytest.mark.parametrize("tag", ["s", "f", "d"])
def test_hashed_containers_are_capped(tag: str) -> None:
    from reward_models.plaindata import MAX_HASHED

    entry = [0, 0] if tag == "d" else 0
    assert from_plain({tag: [entry] * MAX_HASHED}) is not None  # at the cap: fine
    with pytest.raises(PlainDataError, match="entries"):
        from_plain({tag: [entry] * (MAX_HASHED + 1)})

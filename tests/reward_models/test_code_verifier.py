"""verifier.code and its sandbox, adversarial programs included."""

from __future__ import annotations

import os
import uuid

import pytest

from reward_models import make_component
from reward_models.sandbox import SandboxLimits, isolation_prefix, run_python
from reward_models.text import extract_code
from tests.reward_models.helpers import make_prompt, make_sample, processes_with

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
FAST = {"timeout_s": 3.0, "memory_mb": 256}  # generous: a busy CI machine must not turn passes into timeouts


def run_code(answer: str, tests: str = TESTS, **params: object):
    component = make_component("verifier.code", {**FAST, **params})
    return component.score(make_sample(answer), make_prompt({"tests": tests}))


def test_correct_code_passes_and_wrong_code_fails() -> None:
    passed = run_code("```python\ndef add(a, b):\n    return a + b\n```")
    assert passed.value == 1.0 and passed.details["verdict"] == "passed"
    failed = run_code("```python\ndef add(a, b):\n    return a - b\n```")
    assert failed.value == 0.0 and failed.details["verdict"] == "failed"
    assert "AssertionError" in failed.details["stderr"]


def test_last_fenced_block_else_whole_answer() -> None:
    answer = "First try:\n```python\ndef add(a, b): return 0\n```\nFixed:\n```python\ndef add(a, b): return a + b\n```"
    assert extract_code(answer).strip() == "def add(a, b): return a + b"
    assert extract_code("def add(a, b): return a + b") == "def add(a, b): return a + b"
    assert run_code(answer).value == 1.0
    assert run_code("def add(a, b):\n    return a + b").value == 1.0


def test_unittest_main_counts_with_its_exit_code() -> None:
    tests = (
        "import unittest\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\nunittest.main()\n"
    )
    assert run_code("def add(a, b): return a + b", tests).value == 1.0
    assert run_code("def add(a, b): return a * 3", tests).value == 0.0


def test_exiting_before_the_tests_is_a_fail() -> None:
    early = run_code("import sys\nsys.exit(0)\n", "assert False\n")
    assert early.value == 0.0 and "exited before the tests" in early.details["stderr"]
    hard = run_code("import os\nos._exit(0)\n", "assert False\n")
    assert hard.value == 0.0 and hard.details["verdict"] == "exited_early"


def test_rewriting_or_deleting_files_cannot_change_the_outcome() -> None:
    rewrite = "open('tests.py', 'w').write('pass')\ndef add(a, b): return 0\n"
    assert run_code(rewrite).value == 0.0  # the tests were read before the solution ran
    wipe = "import os\nfor name in os.listdir('.'):\n    os.remove(name)\ndef add(a, b): return a + b\n"
    assert run_code(wipe).value == 1.0
    assert run_code(wipe.replace("a + b", "a * b")).value == 0.0


def test_syntax_error_is_a_fail_not_a_sandbox_error() -> None:
    result = run_code("def add(a, b) return a + b")
    assert result.value == 0.0 and "SyntaxError" in result.details["stderr"]


def test_infinite_loop_times_out_as_a_fail_or_an_error() -> None:
    looped = run_code("def add(a, b):\n    while True:\n        pass\n", timeout_s=1.0)
    assert looped.value == 0.0 and looped.details["verdict"] == "timeout"
    as_error = run_code("import time\ntime.sleep(60)\n", timeout_s=1.0, on_timeout="error")
    assert as_error.value is None and as_error.error == "timeout after 1.0s"


def test_fork_bomb_is_stopped_and_leaves_nothing_behind() -> None:
    marker = f"bomb-{uuid.uuid4().hex}"
    bomb = f"import os\n# {marker}\nwhile True:\n    os.fork()\n"
    result = run_code(bomb)
    assert result.value == 0.0
    assert "creating processes is disabled" in result.details["stderr"]
    assert processes_with(marker) == []


def test_whole_process_tree_is_killed_on_timeout() -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"  # a unique sleep duration to find it by
    code = f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\ntime.sleep(60)\n"
    result = run_code(code, timeout_s=1.0, allow_subprocess=True)
    assert result.details["verdict"] == "timeout"
    assert processes_with(marker) == []


def test_memory_hog_fails_within_its_limit() -> None:
    result = run_code("blocks = []\nwhile True:\n    blocks.append(bytearray(8 * 2**20))\n", memory_mb=128)
    assert result.value == 0.0
    assert "MemoryError" in result.details["stderr"]


def test_network_is_blocked() -> None:
    code = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n"
    result = run_code(code)
    assert result.value == 0.0
    assert "network access is disabled" in result.details["stderr"]
    isolation, _ = isolation_prefix()
    assert result.details["isolation"] == isolation


def test_network_namespace_blocks_even_when_the_hook_allows() -> None:
    isolation, _ = isolation_prefix()
    if "netns" not in isolation:
        pytest.skip("unshare cannot create a network namespace on this machine")
    code = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n"
    result = run_code(code, allow_network=True)
    assert result.value == 0.0
    assert "unreachable" in result.details["stderr"] or "OSError" in result.details["stderr"]


def test_environment_is_scrubbed_and_cwd_is_a_fresh_temp_dir() -> None:
    os.environ["GRPO_SECRET_FOR_TEST"] = "hunter2"
    try:
        code = (
            "import os\nassert 'GRPO_SECRET_FOR_TEST' not in os.environ\n"
            "assert sorted(os.listdir('.')) == ['solution.py', 'tests.py']\n"
        )
        assert run_code(code, "pass\n").value == 1.0
    finally:
        del os.environ["GRPO_SECRET_FOR_TEST"]


def test_output_is_truncated() -> None:
    result = run_code("print('x' * 100_000)\n" + "def add(a, b): return a + b\n", max_output_bytes=1000)
    assert result.value == 1.0
    assert len(result.details["stdout"]) < 1100 and result.details["stdout"].endswith("[truncated]")


def test_output_flood_is_bounded_by_the_file_size_limit() -> None:
    result = run_python(
        "while True:\n    print('y' * 10_000)\n",
        "pass\n",
        SandboxLimits(timeout_s=5.0, max_file_mb=1, max_output_bytes=100),
    )
    assert result.verdict == "failed"
    assert "File too large" in result.stderr


def test_missing_tests_is_an_error() -> None:
    result = make_component("verifier.code", FAST).score(make_sample("x = 1"), make_prompt({"answer": "1"}))
    assert result.value is None and "no 'tests'" in (result.error or "")


def test_batch_runs_in_parallel_and_keeps_order() -> None:
    component = make_component("verifier.code", {**FAST, "max_parallel": 4})
    answers = [
        "def add(a, b): return a + b",
        "def add(a, b): return 0",
        "while True: pass",
        "def add(a, b): return b + a",
    ]
    items = [(make_sample(a), make_prompt({"tests": TESTS})) for a in answers]
    results = component.score_batch(items)
    assert [r.value for r in results] == [1.0, 0.0, 0.0, 1.0]
    assert results[2].details["verdict"] == "timeout"

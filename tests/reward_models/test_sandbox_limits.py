"""Sandbox resource limits: shared memory, memory-backed files, IPC objects and /tmp are bounded and die
with the task. Each case reproduces an attack of the second round on verifier.code (docs/sandbox.md).
"""

from __future__ import annotations

import pytest

from reward_models import make_component
from reward_models.code_harness import run_function_tests
from reward_models.sandbox import SandboxLimits, checkout
from reward_models.sandbox_settings import SandboxSettings
from tests.reward_models.helpers import make_prompt, make_sample


def score(answer: str, reference: dict, **params: object):
    component = make_component("verifier.code", {"timeout_s": 5.0, "memory_mb": 256, **params})
    return component.score(make_sample(answer), make_prompt(reference))



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


# Attack (verifier.code, round 2) broke this: sysv shared memory neither exceeds the limit nor outlives the task
def test_sysv_shared_memory_neither_exceeds_the_limit_nor_outlives_the_task() -> None:
    """Finding 7: every task of a warm sandbox shares the zygote's IPC namespace; a program with
    memory_mb=64 pinned 6 x 32 MiB of SysV shared memory that survived it and that the next sample
    found. The seccomp filter now refuses shmget / semget / msgget / mq_open (EPERM)."""
    leak = score(SHM_LEAK, {"tests": "made = leak()\nassert made == 0, made\n"}, memory_mb=64)
    assert leak.error is None, leak.error
    probe = score(SHM_PROBE, {"tests": "found = probe()\nassert found == 0, found\n"}, memory_mb=64)
    assert probe.error is None, probe.error
    assert probe.details["verdict"] == "passed", (leak.details["reason"], probe.details["reason"])


# Attack (verifier.code, round 2) broke this: memory backed files count against the memory limit
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


# Attack (verifier.code, round 2) broke this: ipc objects and memfds are refused under every setting
@pytest.mark.parametrize("allow_subprocess", [False, True])
# Attack (verifier.code, round 2) broke this: ipc objects and memfds are refused under every setting
def test_ipc_objects_and_memfds_are_refused_under_every_setting(allow_subprocess: bool) -> None:
    tests = "assert keepers() == dict.fromkeys(['shmget', 'semget', 'msgget', 'mq_open', 'memfd_create'], True), keepers()\n"
    with checkout(SandboxSettings(allow_subprocess=allow_subprocess)) as sandbox:
        outcome = run_function_tests(
            sandbox, SandboxLimits(timeout_s=5.0, memory_mb=256), PROBE_KEEPERS, tests, None
        )
    assert outcome.verdict == "passed", outcome.reason


# Attack (verifier.code, round 2) broke this: tmp files are bounded by the tmpfs
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

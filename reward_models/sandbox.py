"""Run untrusted Python (a solution, then its unit tests) in a sandboxed subprocess.

Isolation, strongest available first (probed once per process):
``unshare --user --map-root-user --net --pid --fork --kill-child`` (no network; the program is PID 1
of its own namespace, so killing it kills every process it made), then ``unshare --net --pid``
(root without user namespaces), then none. Always: ``python -I`` in a fresh temp dir, scrubbed
environment, rlimits (address space, CPU, processes, file size, no core), an audit hook that refuses
sockets and process creation, a wall-clock timeout after which the whole session is SIGKILLed, and
stdout / stderr written to files (bounded by RLIMIT_FSIZE) of which only a few KB are kept.
No ``signal.alarm`` anywhere: safe from any thread.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import BinaryIO, Literal

from reward_models.proctree import kill_group
from reward_models.sandbox_boot import BOOT

Verdict = Literal["passed", "failed", "timeout", "exited_early"]
_UNSHARE_MODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("userns+netns+pidns", ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")),
    ("netns+pidns", ("--net", "--pid", "--fork", "--kill-child")),
)
_SETUP_FAILED = 125
_WATCHDOG_EXIT = 124


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, crashed before running the program)."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Limits for one run. ``timeout_s`` is wall time from process start; CPU time is capped at
    ``ceil(timeout_s) + 1`` s; ``max_output_bytes`` is what is kept of stdout and of stderr."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_file_mb: int = 16
    max_output_bytes: int = 4096
    allow_network: bool = False
    allow_subprocess: bool = False


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What happened: ``verdict`` is ``passed`` only if the tests ran to the end and exit code was 0."""

    verdict: Verdict
    returncode: int | None
    stdout: str
    stderr: str
    wall_ms: float
    isolation: str

    def details(self) -> dict:
        """A JSON-able summary for ComponentResult.details."""
        return {
            "verdict": self.verdict,
            "returncode": self.returncode,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "wall_ms": round(self.wall_ms, 1),
            "isolation": self.isolation,
        }


@functools.lru_cache(maxsize=1)
def isolation_prefix() -> tuple[str, tuple[str, ...]]:
    """The strongest ``unshare`` prefix that works here, found by running a no-op once."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "none", ()
    for name, flags in _UNSHARE_MODES:
        cmd = (unshare, *flags, "--", sys.executable, "-I", "-c", "pass")
        try:
            ok = subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return name, (unshare, *flags, "--")
    return "none", ()


def _config(limits: SandboxLimits, isolation: str, status_fd: int) -> str:
    nproc_relative = not isolation.startswith("userns") and os.geteuid() != 0
    return json.dumps(
        {
            "memory_bytes": limits.memory_mb * 2**20,
            "cpu_s": math.ceil(limits.timeout_s) + 1,
            "file_bytes": limits.max_file_mb * 2**20,
            "max_processes": limits.max_processes,
            "nproc_relative": nproc_relative,
            "wall_s": limits.timeout_s + 1.0,
            "allow_network": limits.allow_network,
            "allow_subprocess": limits.allow_subprocess,
            "status_fd": status_fd,
        }
    )


def _environment(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _kill_session(proc: subprocess.Popen) -> None:
    """Kill the sandbox's process group (its session) and wait until every member is gone."""
    kill_group(proc.pid)
    proc.wait()


def _read_head(fh: BinaryIO, limit: int) -> str:
    fh.seek(0)
    data = fh.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + "\n[truncated]" if len(data) > limit else text


def _read_tail(fh: BinaryIO, limit: int) -> str:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(size - limit, 0))
    text = fh.read().decode("utf-8", "replace")
    return "[truncated]\n" + text if size > limit else text


def _read_status(fd: int) -> list[str]:
    """What the bootstrap wrote to the status pipe ("ready", then the token), without blocking."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
            if sum(map(len, chunks)) > 65536:
                break
    except BlockingIOError:
        pass  # a process the program started may still hold the pipe open
    return b"".join(chunks).decode("utf-8", "replace").split()


def _launch(
    workdir: str, limits: SandboxLimits, token: str, out: BinaryIO, err: BinaryIO, status_fd: int
) -> tuple[subprocess.Popen, str]:
    isolation, prefix = isolation_prefix()
    config = _config(limits, isolation, status_fd)
    cmd = [*prefix, sys.executable, "-I", "-c", BOOT, config]
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=_environment(workdir),
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            pass_fds=(status_fd,),
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"could not start the sandbox: {exc}") from exc
    try:
        assert proc.stdin is not None
        proc.stdin.write(f"{token}\n".encode())
        proc.stdin.close()
    except OSError:
        pass  # it died already; the status pipe tells why
    return proc, isolation


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the process; on timeout kill its whole session (before it is reaped, so its pid
    cannot have been reused). True if it timed out."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        return True


def _verdict(timed_out: bool, returncode: int, status: list[str], token: str) -> Verdict:
    if timed_out or returncode == _WATCHDOG_EXIT or returncode == -signal.SIGKILL:
        return "timeout"
    if returncode == 0 and token in status:
        return "passed"
    return "exited_early" if returncode == 0 else "failed"


def run_python(solution: str, tests: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``solution`` then ``tests`` (Python source) under ``limits``; raise SandboxError when the
    sandbox itself fails (not when the program fails, times out or runs out of memory).

    stdout / stderr go to unlinked temp files and the status to a pipe, so nothing the program
    does to its working directory can hide the outcome."""
    limits = limits or SandboxLimits()
    token = secrets.token_hex(16)
    with (
        tempfile.TemporaryDirectory(prefix="grpo-sandbox-") as workdir,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        for name, source in (("solution.py", solution), ("tests.py", tests)):
            with open(os.path.join(workdir, name), "w", encoding="utf-8") as fh:
                fh.write(source)
        status_r, status_w = os.pipe()
        try:
            start = time.perf_counter()
            try:
                proc, isolation = _launch(workdir, limits, token, out, err, status_w)
            finally:
                os.close(status_w)
            timed_out = _wait(proc, limits.timeout_s)
            wall_ms = (time.perf_counter() - start) * 1000.0
            status = _read_status(status_r)
        finally:
            os.close(status_r)
        stderr = _read_tail(err, limits.max_output_bytes)
        if not timed_out and ("ready" not in status or proc.returncode == _SETUP_FAILED):
            raise SandboxError(
                f"sandbox crashed before the program ran (exit {proc.returncode}): {stderr[-500:]}"
            )
        return SandboxResult(
            verdict=_verdict(timed_out, proc.returncode, status, token),
            returncode=None if timed_out else proc.returncode,
            stdout=_read_head(out, limits.max_output_bytes),
            stderr=stderr,
            wall_ms=wall_ms,
            isolation=isolation,
        )

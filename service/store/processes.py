"""Processes this project starts, and how they all end: no embedded PostgreSQL or child left behind.

- ``exit_on_signals()``: SIGTERM / SIGHUP end the process through ``SystemExit``, so ``finally`` blocks
  and ``atexit`` hooks (the embedded PostgreSQL's stop among them) run. uvicorn re-raises the signal it
  caught after its own shutdown, into the handler installed before it, so ``serve`` exits cleanly too.
- ``hangup_as_terminate()``: uvicorn catches SIGINT and SIGTERM only; a SIGHUP's ``SystemExit`` raised inside
  its running event loop can be swallowed by a task and leave ``serve`` running. ``serve`` turns SIGHUP into
  SIGTERM, so a hang-up takes uvicorn's graceful shutdown like a ``kill``.
- ``prune_dead_handles(pgdata)``: the embedded server (``pgserver``) is stopped by the last process that
  uses it, counted in a pid file; a process killed with SIGKILL stays in that file forever and the server
  would never stop. Dead pids are removed before attaching and again at exit, so the last *live* user
  stops the server (e.g. the demo's service, after the demo itself was killed).
- ``stop_all(procs)``: terminate children (their whole process group when they lead one), wait, kill.
- ``spawn_tied(args, ...)``: start a child that gets SIGTERM when this process dies, even by SIGKILL
  (Linux ``PR_SET_PDEATHSIG``, set between fork and exec); SIGTERM then runs the child's own shutdown,
  so a ``serve`` child still stops its embedded PostgreSQL.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

HANDLES = ".handle_pids.json"  # pgserver's list of the processes using a data directory


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread (no-op off the main thread); a
    SIGHUP inherited as ignored (``nohup``) stays ignored."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue  # started under nohup: a hang-up stays ignored
        try:
            signal.signal(sig, _raise_exit)
        except ValueError:  # not the main thread
            return


def _hangup_to_terminate(_signum: int, _frame: FrameType | None) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def hangup_as_terminate() -> None:
    """SIGHUP sends this process SIGTERM: whoever handles SIGTERM (uvicorn's graceful shutdown while it
    serves, ``exit_on_signals`` before and after) handles a hang-up the same way. Main thread only."""
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # under nohup a hang-up stays ignored
        signal.signal(signal.SIGHUP, _hangup_to_terminate)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(Path(f"/proc/{pid}"))
    return fields is None or fields[0] != "Z"  # no /proc (not Linux): kill(0) is all we know


def prune_dead_handles(pgdata: Path) -> list[int]:
    """Drop the pids of exited processes from pgserver's handle list; returns the pids kept."""
    path = Path(pgdata) / HANDLES
    try:
        pids = [int(p) for p in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []
    alive = [p for p in pids if pid_alive(p)]
    if alive != pids:
        path.write_text(json.dumps(alive))
    return alive


def stop_all(procs: Iterable[subprocess.Popen], timeout_s: float = 20.0) -> None:
    """Terminate each child (its process group when it leads one: started with ``start_new_session``), wait up
    to ``timeout_s`` for each, then kill what is left. The groups of the children that led one when this began
    are waited for too, all within one ``timeout_s``: a leader can exit while its helpers (a browser's utility
    processes, a server's workers) are still shutting down; members that outlive the wait are killed. A child
    already exited and reaped before the call is not followed: its pid may be someone else's by now."""
    procs = list(procs)
    groups = [proc.pid for proc in procs if _leads_group(proc)]
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    for pgid in groups:  # a stopped member (SIGSTOP) would sit on the SIGTERM until the kill
        _killpg(pgid, signal.SIGCONT)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    left = _groups_left(groups, time.monotonic() + timeout_s)
    for pgid in left:
        _killpg(pgid, signal.SIGKILL)
    _groups_left(left, time.monotonic() + timeout_s)


def _leads_group(proc: subprocess.Popen) -> bool:
    try:
        return proc.poll() is None and os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return False


def _killpg(pgid: int, sig: int) -> None:
    """``sig`` to a group; one that is gone, or holds only processes this one may not signal, is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        if os.getpgid(proc.pid) == proc.pid:  # a group leader: reach its children too
            _killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat_fields(entry: Path) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None when it is gone. Read as bytes:
    a name is whatever bytes the kernel kept (cut at 15, mid-character for a long non-ASCII one)."""
    try:
        return (entry / "stat").read_bytes().rsplit(b")", 1)[1].decode("ascii", "replace").split()
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc; [] off Linux."""
    return _members({pgid}).get(pgid, [])


def _members(pgids: set[int]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields and fields[0] != "Z" and int(fields[2]) in pgids:  # state, ppid, pgrp
            found.setdefault(int(fields[2]), []).append(int(entry.name))
    return found


def _groups_left(pgids: list[int], deadline: float) -> list[int]:
    """Wait until none of ``pgids`` has a live member, or ``deadline`` -> the groups still there."""
    left = set(pgids)
    while left:
        left = set(_members(left))
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return sorted(left)


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of live processes (from /proc) that contain ``marker`` -- e.g. a run's temp dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{entry.name}: {cmdline.strip()}")
    return found


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent (a forked child should not dlopen); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn``: the child gets ``sig`` when the process that spawned it dies (for any reason,
    SIGKILL included); it exits at once when that process is already gone. None where unsupported."""
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def spawn_tied(args: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args)`` whose child is sent SIGTERM when this process dies (see
    ``die_with_parent``). Spawn from the main thread: the signal follows the thread that forked."""
    return subprocess.Popen(args, preexec_fn=die_with_parent(), **popen_kwargs)  # noqa: PLW1509

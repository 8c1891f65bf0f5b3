"""stop_all: a child that leads a process group is gone with its whole group, helpers included, when stop_all
returns (a browser's utility process outlived its leader by a moment and was still there for the caller's
check, CI run of 2026-12-07)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

from service.store.processes import group_members, processes_mentioning, stop_all


def _group_with_a_helper(on_term: str, marker: str, shell_waits: bool = True) -> subprocess.Popen:
    """A shell leading its own group, with a Python helper that does ``on_term`` on SIGTERM; returned once
    the helper runs. The shell itself ends at once on SIGTERM (or, ``shell_waits=False``, on its own)."""
    helper = (
        "import signal, sys, time\n"
        f"{on_term}\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    tail = "wait" if shell_waits else "exit 0"
    proc = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0" {marker} & {tail}', helper],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_helper_that_takes_its_time_to_exit_is_waited_for():
    marker = f"slow-helper-{uuid.uuid4().hex}"
    slow_exit = "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.6), sys.exit(0)))"
    proc = _group_with_a_helper(slow_exit, marker)
    stop_all([proc], timeout_s=10)
    assert processes_mentioning(marker) == []
    assert group_members(proc.pid) == []


def test_a_helper_that_ignores_sigterm_is_killed_after_the_timeout():
    marker = f"deaf-helper-{uuid.uuid4().hex}"
    proc = _group_with_a_helper("signal.signal(signal.SIGTERM, signal.SIG_IGN)", marker)
    start = time.monotonic()
    stop_all([proc], timeout_s=1)
    assert processes_mentioning(marker) == []
    assert group_members(proc.pid) == []
    assert time.monotonic() - start < 5  # the timeout, then SIGKILL: not the helper's 60 s


def test_a_child_that_already_exited_is_no_error():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    stop_all([proc], timeout_s=1)
    assert proc.returncode == 0


def test_a_leader_that_exited_first_leaves_no_helper_behind():
    """The group's leader is gone (and reaped) before stop_all; its helper, still in the group, is stopped
    with SIGTERM at once, not left running nor waited for until the timeout."""
    marker = f"orphan-helper-{uuid.uuid4().hex}"
    proc = _group_with_a_helper("pass", marker, shell_waits=False)
    proc.wait(timeout=10)
    assert processes_mentioning(marker) != []
    start = time.monotonic()
    stop_all([proc], timeout_s=10)
    assert processes_mentioning(marker) == [] and group_members(proc.pid) == []
    assert time.monotonic() - start < 5

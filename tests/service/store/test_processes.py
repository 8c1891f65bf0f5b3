"""stop_all: a child that leads a process group is gone with its whole group, helpers included, when stop_all
returns (a browser's utility process outlived its leader by a moment and was still there for the caller's
check, CI run of 2026-12-07)."""

from __future__ import annotations

import os
import shutil
import signal
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



def test_groups_are_waited_for_together_not_one_timeout_each():
    marker = f"deaf-trio-{uuid.uuid4().hex}"
    procs = [_group_with_a_helper("signal.signal(signal.SIGTERM, signal.SIG_IGN)", marker) for _ in range(3)]
    start = time.monotonic()
    stop_all(procs, timeout_s=1.5)
    assert processes_mentioning(marker) == []
    assert time.monotonic() - start < 4  # one 1.5 s wait for the three groups, then SIGKILL (was 1.5 s each)


def test_a_stopped_helper_is_continued_and_ends_on_sigterm(tmp_path):
    """A helper stopped with SIGSTOP gets SIGCONT after the SIGTERM: it runs its own shutdown (here: writes a
    file), long before the timeout's SIGKILL."""
    marker = f"stopped-helper-{uuid.uuid4().hex}"
    done = tmp_path / "done"
    on_term = f"signal.signal(signal.SIGTERM, lambda *a: (open({str(done)!r}, 'w').close(), sys.exit(0)))"
    proc = _group_with_a_helper(on_term, marker)
    [helper] = [int(line.split(":")[0]) for line in processes_mentioning(marker) if ": sh " not in line]
    os.kill(helper, signal.SIGSTOP)
    start = time.monotonic()
    stop_all([proc], timeout_s=20)
    assert done.exists() and processes_mentioning(marker) == []
    assert time.monotonic() - start < 10


def test_a_process_named_in_broken_utf8_is_no_error(tmp_path):
    """/proc/<pid>/stat holds a command name cut at 15 bytes, mid-character for a long non-ASCII one: another
    user's process named so must not make stop_all raise before it stopped the children."""
    link = tmp_path / ("\u00e9" * 9)
    link.symlink_to(shutil.which("sleep"))
    bystander = subprocess.Popen([str(link), "30"])
    marker = f"utf8-helper-{uuid.uuid4().hex}"
    try:
        proc = _group_with_a_helper("pass", marker)
        stop_all([proc], timeout_s=5)
        assert processes_mentioning(marker) == [] and group_members(proc.pid) == []
        assert bystander.poll() is None  # not ours: untouched
    finally:
        bystander.kill()
        bystander.wait()

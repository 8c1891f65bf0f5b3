"""SIGTERM or SIGKILL of the demo stops every process it started, the embedded PostgreSQL included (Ctrl-C:
tests/rollout/test_demo_interrupt.py, one interrupted run checks its output and that nothing is left)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT


def _pids(marker) -> list[int]:
    """Live processes naming ``marker`` in their command line or environment (the demo's service gets
    its data dir only through GRPO_CURATOR_DATA_DIR)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue  # a zombie is not running
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if str(marker).encode() in blob:
            found.append(int(entry.name))
    return found


def _describe(marker) -> str:
    lines = []
    for pid in _pids(marker):
        try:
            lines.append(f"{pid}: " + open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:160])
        except OSError:
            pass
    return "; ".join(lines)


def _wait_for(pred, timeout_s: float, step: float = 0.3) -> bool:

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def _reap(marker) -> None:
    """Stop what a broken run left (only processes naming this test's own temp dir)."""
    import time

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while _pids(marker) and time.monotonic() < deadline:
            time.sleep(0.3)


def _start_demo(out):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    return subprocess.Popen([sys.executable, "-m", "service.cli", "demo", "--versions", "50", "--minutes", "5",
                             "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


# Attack: SIGTERM to the demo while its service started left the service and the embedded PostgreSQL running.
def test_sigterm_to_the_demo_while_its_service_starts_leaves_nothing(tmp_path):
    """`kill <demo pid>` (or `timeout`, a CI job cancel) in the first seconds, while start_service waits
    for /healthz: SystemExit leaves wait_healthy, but the serve process is not yet in the list the
    finally-block stops, so `grpo-curator serve` and its embedded PostgreSQL keep running for ever."""

    out = tmp_path / "demo"
    proc = _start_demo(out)
    try:
        # the service has started its embedded PostgreSQL and is migrating: the demo is in wait_healthy
        assert _wait_for(lambda: "bin/postgres" in _describe(out), 120, step=0.1), "the demo never started its service"
        os.kill(proc.pid, signal.SIGTERM)  # the demo only, as `kill PID` does
        proc.wait(timeout=60)
        assert _wait_for(lambda: not _pids(out), 30), \
            "left running: " + _describe(out)
    finally:
        if proc.poll() is None:
            proc.kill()
        _reap(out)


# Attack: kill -9 of the demo left its children (no tie to it) running.
def test_sigkill_of_the_demo_leaves_no_process(tmp_path):
    """kill -9 of the demo (OOM killer, a CI runner's hard stop): its children have no tie to it (no
    PR_SET_PDEATHSIG, no parent watch), so the service, the embedded PostgreSQL, the trainer and the
    rollout producer all keep running, the producer sampling for ever."""

    out = tmp_path / "demo"
    proc = _start_demo(out)
    try:
        assert _wait_for(lambda: "trainer.worker" in _describe(out) and "rollout.producer" in _describe(out), 240), \
            "the demo never started its workers"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _wait_for(lambda: not _pids(out), 30), "left running: " + _describe(out)
    finally:
        if proc.poll() is None:
            proc.kill()
        _reap(out)

"""Processes end with the process that started them: spawn_tied's children after a SIGKILL of their
parent, and the demo's service (embedded PostgreSQL included) when its health check times out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from service.store.processes import pid_alive, processes_mentioning
from tests.conftest import ROOT


def _gone(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_a_tied_child_ends_when_its_parent_is_killed(tmp_path):
    """The parent spawns a child that ignores nothing and sleeps; kill -9 of the parent -> the child
    gets SIGTERM (PR_SET_PDEATHSIG) and ends; an untied sibling would live on (checked as a control)."""
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from service.store.processes import spawn_tied
        tied = spawn_tied([sys.executable, "-c", "import time; time.sleep(600)", "tied-{tmp_path.name}"])
        free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "free-{tmp_path.name}"])
        print(tied.pid, free.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    tied = free = None
    try:
        tied, free = (int(p) for p in parent.stdout.readline().split())
        assert pid_alive(tied) and pid_alive(free)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert _gone(lambda: not processes_mentioning(f"tied-{tmp_path.name}"), 10), "the tied child outlived its parent"
        assert processes_mentioning(f"free-{tmp_path.name}"), "control: an untied child should have survived"
    finally:
        for pid in (tied, free):
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def test_demo_health_check_timeout_stops_the_service_and_its_postgres(tmp_path):
    """The service is not healthy within --startup-timeout: the demo says so in one line, exits non-zero,
    and nothing it started runs on (neither `serve` nor the embedded PostgreSQL it was initialising)."""
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    proc = subprocess.run([sys.executable, "-m", "service.cli", "demo", "--startup-timeout", "0.5", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "not healthy" in lines[0], proc.stderr
    # postgres processes carry the data dir in their command line (-D .../state/pgdata)
    assert _gone(lambda: not processes_mentioning(str(out)), 30), processes_mentioning(str(out))

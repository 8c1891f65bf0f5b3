"""Ctrl-C during the demo stops every process it started, the embedded PostgreSQL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from service.worker.processes import processes_mentioning
from tests.conftest import ROOT


@pytest.mark.slow
def test_ctrl_c_leaves_no_process(tmp_path):
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    # a session of its own, like a terminal: Ctrl-C signals the whole foreground process group
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "demo", "--versions", "50", "--minutes", "5",
                             "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not any("trainer" in p or "rollout" in p for p in processes_mentioning(str(out))):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.5)
        assert processes_mentioning(str(out)), "the demo never started its processes"
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 15
    while (left := processes_mentioning(str(out))) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert left == []

"""Ctrl-C of the demo says "interrupted" (not "error: ConnectError ...": its children get the same SIGINT
and the service goes away first), still writes the table, the plot and the data of what it had, and stops
every process it started, the embedded PostgreSQL included.

One Ctrl-C of one demo run checks both (the process check was tests/trainer/test_demo_cleanup.py's
test_ctrl_c_leaves_no_process, a second demo started only to be interrupted the same way)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from service.store.processes import processes_mentioning
from tests.conftest import ROOT, as_from_a_terminal


@pytest.mark.slow
def test_ctrl_c_says_interrupted_writes_the_plot_of_what_it_had_and_leaves_no_process(tmp_path):
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    # a session of its own, like a terminal: Ctrl-C signals the whole foreground process group
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "demo", "--versions", "500", "--minutes", "10",
                             "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=as_from_a_terminal)
    try:
        line = proc.stdout.readline()  # the first progress line: the run is being watched
        assert "policy v" in line, (line, proc.poll(), proc.poll() is not None and proc.stderr.read()[-3000:])
        running = processes_mentioning(str(out))
        # the demo started its workers before it watches (and checks they are alive on every progress line)
        assert any("trainer" in p for p in running) and any("rollout" in p for p in running), running
        os.killpg(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert "interrupted" in lines, err[-2000:]
    # the demo's own failure line would be "error: ..." (ConnectError before); pgserver may log its own
    # shutdown noise when the test's temp dir is unreadable to its user, which is not the demo's
    assert not any(line.startswith("error: ") for line in lines), err[-2000:]
    assert "ConnectError" not in err and "Traceback" not in err, err[-2000:]
    assert (out / "demo.png").stat().st_size > 0 and (out / "demo.json").is_file()
    assert "plot:" in rest
    # every process it started is gone: service, trainer, producer, the embedded PostgreSQL
    deadline = time.monotonic() + 15
    while (left := processes_mentioning(str(out))) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert left == [], "left running after Ctrl-C: " + "; ".join(left)

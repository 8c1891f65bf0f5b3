"""A score worker's stop signal is never lost (service.worker.main.StopOnSignals): a SIGTERM that came during
start-up, whose SystemExit Python dropped because it was raised inside a ``__del__``, still stops it. Each case
runs in a process of its own (signal handlers are process-wide), with real signals."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT, as_from_a_terminal

PRELUDE = """
import os, signal, sys, threading
from service.worker.main import StopOnSignals
stop = threading.Event()
signals = StopOnSignals(stop)
class Finalised:
    def __del__(self):  # a signal handled while a finaliser runs: its exception is printed and dropped
        os.kill(os.getpid(), signal.{sig})
"""


def _run(body: str, sig: str = "SIGTERM") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE.format(sig=sig) + body], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, preexec_fn=as_from_a_terminal)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_during_start_up_ends_it_at_once(sig):
    proc = _run(f"os.kill(os.getpid(), signal.{sig})\nprint('still running')", sig)
    assert proc.returncode == 128 + getattr(signal, sig) and "still running" not in proc.stdout, proc.stderr


def test_a_dropped_start_up_exit_still_leaves_the_stop_flag_set():
    """The SystemExit raised in the finaliser is dropped (Python prints 'Exception ignored'): the process goes
    on, and the flag the worker checks after start-up says stop, with the signal that came."""
    proc = _run("Finalised()\nprint('went on', stop.is_set(), signals.signum)")
    assert "Exception ignored" in proc.stderr and "SystemExit" in proc.stderr  # the mechanism, as Python has it
    assert proc.returncode == 0 and proc.stdout.split() == ["went", "on", "True", str(int(signal.SIGTERM))], proc.stderr


def test_after_start_up_a_signal_only_sets_the_flag():
    """The loop ends the pass it is in: no SystemExit in the middle of a pass's transaction."""
    proc = _run("signals.started()\nos.kill(os.getpid(), signal.SIGTERM)\nprint('flag', stop.is_set())")
    assert proc.returncode == 0 and proc.stdout.split() == ["flag", "True"], proc.stderr


def _ignoring(sig: int) -> None:
    signal.signal(sig, signal.SIG_IGN)  # in the child before exec: what `nohup` / a shell's `cmd &` hand down


@pytest.mark.parametrize("sig", ["SIGINT", "SIGHUP"])
def test_an_interrupt_or_hang_up_the_parent_ignores_stays_ignored(sig):
    """Before StopOnSignals runs, Python leaves an inherited SIG_IGN alone; catching the signal afterwards would
    make a `nohup` worker's fate depend on when the hang-up came. exit_on_signals (every command's first step)
    keeps an ignored SIGHUP too. SIGTERM still stops it."""
    body = (f"from service.store.processes import exit_on_signals\nexit_on_signals()\n"
            f"stop = threading.Event()\nsignals = StopOnSignals(stop)\n"
            f"os.kill(os.getpid(), signal.{sig})\nprint('ignored', stop.is_set())\n"
            f"os.kill(os.getpid(), signal.SIGTERM)\nprint('not reached')")
    script = "import os, signal, threading\nfrom service.worker.main import StopOnSignals\n" + body
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: _ignoring(getattr(signal, sig)))
    assert proc.stdout.split() == ["ignored", "False"] and proc.returncode == 128 + signal.SIGTERM, proc.stderr


@pytest.mark.parametrize("ignored", [True, False])
def test_serve_s_hang_up_handler_keeps_nohup(ignored):
    """``serve``'s hangup_as_terminate after exit_on_signals (its start-up order): under `nohup` a hang-up is still
    ignored; from a terminal it becomes the SIGTERM that stops the process."""
    script = ("import os, signal\nfrom service.store.processes import exit_on_signals, hangup_as_terminate\n"
              "exit_on_signals()\nhangup_as_terminate()\nos.kill(os.getpid(), signal.SIGHUP)\nprint('alive')")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          preexec_fn=(lambda: _ignoring(signal.SIGHUP)) if ignored else as_from_a_terminal)
    if ignored:
        assert proc.returncode == 0 and proc.stdout.split() == ["alive"], proc.stderr
    else:
        assert proc.returncode == 128 + signal.SIGTERM and "alive" not in proc.stdout, proc.stderr

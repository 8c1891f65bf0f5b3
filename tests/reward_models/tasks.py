"""Module-level task functions for KillablePool tests (workers import them by name)."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str) -> None:
    raise ValueError(message)


def spin() -> None:
    while True:
        pass


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def spawn_child_and_hang(marker: str) -> None:
    """Start a child process (same process group) that would outlive us, then hang."""
    subprocess.Popen(["sleep", marker])
    time.sleep(3600)


def allocate(megabytes: int) -> int:
    return len(bytearray(megabytes * 2**20))


def unpicklable_result() -> object:
    return lambda: None

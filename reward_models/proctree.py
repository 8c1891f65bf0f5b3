"""Kill a whole process group and wait until it is really gone (Linux ``/proc``).

``killpg`` only sends the signal: members die asynchronously, and a child whose parent died first is
reaped by someone else later. Waiting for the group to empty makes "killed" mean "no longer
running" when the caller returns (no stray CPU burners, no leaked sandboxes).
"""

from __future__ import annotations

import os
import signal
import time


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``; [] where /proc is missing."""
    members = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()  # after "(comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(pid)
    return members


def kill_group(pgid: int, wait_s: float = 2.0) -> None:
    """SIGKILL process group ``pgid`` and wait (at most ``wait_s``) until no member is alive."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + wait_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)

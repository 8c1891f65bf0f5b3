"""Checkpoint readers and deletion that cannot race: a producer loading a checkpoint holds a shared
`flock` on `<dir>/.locks/step-N.lock`; pruning old checkpoints takes the exclusive lock without
waiting and skips a checkpoint someone is reading (the next save prunes it). A pruned checkpoint is
first renamed out of the `step-N` namespace, so a reader that picked it just before sees it gone once
it holds the lock, and retries with the newest checkpoint. (POSIX `flock`: advisory, one machine or a
file system that supports it, such as a local disk; not every network file system does.)
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer.checkpoint_layout import STATE_FILE, latest_checkpoint
from trainer.checkpoint_layout import checkpoints as _checkpoints

LOCK_DIR = ".locks"


def _open_lock(step_dir: Path) -> int:
    locks = step_dir.parent / LOCK_DIR
    locks.mkdir(exist_ok=True)
    return os.open(locks / f"{step_dir.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)


@contextmanager
def read_latest(ckpt_dir: str | Path | None, attempts: int = 50) -> Iterator[Path | None]:
    """The newest complete checkpoint, held against pruning for the `with` body (None when none)."""
    for _ in range(attempts):
        ckpt = latest_checkpoint(ckpt_dir)
        if ckpt is None:
            yield None
            return
        fd = _open_lock(ckpt)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if (ckpt / STATE_FILE).is_file():
                yield ckpt
                return
        finally:
            os.close(fd)  # closing the descriptor releases the lock
    raise RuntimeError(f"{ckpt_dir}: checkpoints were pruned under every one of {attempts} attempts to read")


def prune(ckpt_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints that nobody is reading -> the deleted ones."""
    deleted = []
    for old in _checkpoints(ckpt_dir)[:-keep_last] if keep_last > 0 else []:
        fd = _open_lock(old)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a producer is loading it
        try:
            doomed = old.with_name(old.name + ".deleting")
            old.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            (old.parent / LOCK_DIR / f"{old.name}.lock").unlink(missing_ok=True)
            deleted.append(old)
        finally:
            os.close(fd)
    return deleted

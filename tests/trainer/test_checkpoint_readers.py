"""Pruning old checkpoints never deletes one a producer is loading; a reader never loads a half-deleted one."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import torch

from tests.trainer.batches import tiny_model
from trainer.checkpoint import TrainerState, _checkpoints, save_checkpoint
from trainer.checkpoint_readers import _open_lock, prune, read_latest


def _saver(tmp_path):
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return lambda step, keep=1: save_checkpoint(tmp_path, model, opt, TrainerState(step, step), keep_last=keep)


def test_a_checkpoint_being_read_survives_pruning_until_released(tmp_path):
    save = _saver(tmp_path)
    first = save(1)
    with read_latest(tmp_path) as held:
        assert held == first
        for step in (2, 3, 4):  # the trainer saves and prunes (keep_last=1) while the producer loads
            save(step)
        assert (held / "model.safetensors").is_file()  # still whole
        assert [p.name for p in _checkpoints(tmp_path)] == ["step-00000001", "step-00000004"]
    assert prune(tmp_path, 1) == [first]  # released: the next prune takes it
    assert [p.name for p in _checkpoints(tmp_path)] == ["step-00000004"]
    assert not any(p.name.endswith(".deleting") for p in tmp_path.iterdir())


def test_a_reader_waiting_on_a_checkpoint_being_deleted_moves_to_the_newest_left(tmp_path):
    save = _saver(tmp_path)
    save(1, None)
    second = save(2, None)
    fd = _open_lock(second)  # a deleter holds the newest exclusively, mid-deletion
    fcntl.flock(fd, fcntl.LOCK_EX)
    got: list = []

    def reader():
        with read_latest(tmp_path) as ckpt:
            got.append(ckpt)
            got.append((ckpt / "model.safetensors").is_file())

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.3)  # let the reader pick step 2 and block on its lock (setup, not an assertion)
    second.rename(second.with_name(second.name + ".deleting"))
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    t.join(timeout=30)
    assert got == [_checkpoints(tmp_path)[-1], True] and got[0].name == "step-00000001"


def test_no_checkpoint_reads_none(tmp_path):
    with read_latest(tmp_path / "nothing") as ckpt:
        assert ckpt is None

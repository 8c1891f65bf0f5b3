"""The trainer killed with SIGKILL between a publish and its checkpoint (``save_every`` > 1) resumes
without a 409 and without losing a batch; a batch it cannot use is refused, never a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reward_models.scoring import Scorer
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group
from trainer.checkpoint import latest_checkpoint, load_trainer_state
from trainer.worker import TrainerConfig, run, tiny_model_config

ROOT = Path(__file__).resolve().parents[2]
MODEL = tiny_model_config(vocab_size=512)


def _ready(server, groups: list[dict]) -> None:
    with CuratorClient(server.url) as c:
        for g in groups:
            c.post_group(g)
    with Scorer() as scorer:
        assert drain(make_sessionmaker(get_engine(server.db_url)), scorer).ready == len(groups)


def _groups(prefix: str, n: int) -> list[dict]:
    return [make_group(f"{prefix}-{i}", prompt_id=f"{prefix}p{i}", answers=["42", "41", "42", "0"]) for i in range(n)]


def _count(client: CuratorClient, status: str) -> int:
    return len(client.list_groups(status=status)["groups"])


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _start_trainer(url: str, ckpt: Path) -> subprocess.Popen:
    sets = {"service_url": url, "trainer_id": "crashy", "max_groups": 1, "wait_seconds": 0.5, "lr": 0.01,
            "lease_seconds": 2.0, "checkpoint_dir": str(ckpt), "save_every": 3, "model_config": MODEL}
    cmd = [sys.executable, "-m", "trainer.worker"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_sigkill_between_publish_and_checkpoint_loses_nothing(live_server, tmp_path):
    _ready(live_server, _groups("k", 2))
    ckpt = tmp_path / "ckpt"
    with CuratorClient(live_server.url) as client:
        proc = _start_trainer(live_server.url, ckpt)
        try:
            _wait(lambda: client.get_policy()["version"] == 2, 180, "two published versions")
            time.sleep(2.5)  # idle, past one lease_seconds: only the heartbeat keeps the two leases alive
            assert (_count(client, "leased"), _count(client, "consumed")) == (2, 0)
            assert latest_checkpoint(ckpt) is None  # published v1, v2; the first checkpoint is at step 3
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        # the killed trainer's leases expire; nothing it trained was acked, so nothing is lost
        time.sleep(2.5)
        assert _count(client, "consumed") == 0
        cfg = TrainerConfig(service_url=live_server.url, trainer_id="crashy", model_config=MODEL, lr=0.01,
                            max_groups=1, wait_seconds=0.5, max_idle_polls=2, lease_seconds=2.0,
                            checkpoint_dir=str(ckpt), save_every=3)
        history = run(cfg, client, max_steps=5)  # no 409: continues from the service's latest version
        assert len(history) == 2
        assert client.get_policy()["version"] == 4
        assert load_trainer_state(latest_checkpoint(ckpt)).policy_version == 4
        assert (_count(client, "consumed"), _count(client, "leased"), _count(client, "ready")) == (2, 0, 0)


def test_batch_without_behaviour_logprobs_is_refused_not_a_crash(live_server, tmp_path):
    bare = _groups("nolp", 1)
    for t in bare[0]["trajectories"]:
        del t["logprobs"]
    _ready(live_server, bare + _groups("ok", 1))
    cfg = TrainerConfig(service_url=live_server.url, trainer_id="picky", model_config=MODEL, lr=0.01,
                        max_groups=1, wait_seconds=0.3, max_idle_polls=2, old_from_batch=True)
    with CuratorClient(live_server.url) as client:
        history = run(cfg, client, max_steps=5)
        assert len(history) == 1  # the good group trained; the bare one was never leased to this trainer
        g = client.get_group("nolp-0")  # (lease with need_logprobs): it stays ready for other trainers
        assert g["status"] == "ready", g
        assert client.get_group("ok-0")["status"] == "consumed"

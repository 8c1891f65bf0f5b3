"""The trainer killed with SIGKILL between a publish and its checkpoint (``save_every`` > 1) resumes
without a 409 and without losing a batch; a batch it cannot use is refused, never a crash."""

from __future__ import annotations

import http.server
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from reward_models.scoring import Scorer
from service.client import CuratorClient
from service.settings import Settings
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


def _lease_time_left(db_url: str, trainer_id: str) -> float:
    """Seconds until the last active lease of ``trainer_id`` expires, on the database's clock (0 when none
    is left): after its trainer died, the moment its groups may be leased again."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            left = conn.execute(text(
                "SELECT extract(epoch FROM max(expires_at) - clock_timestamp()) FROM leases "
                "WHERE status = 'active' AND trainer_id = :t"), {"t": trainer_id}).scalar()
    finally:
        engine.dispose()
    return max(0.0, float(left or 0.0))


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


# -- 4. trainer SIGKILLed between checkpoint and ack trains the checkpointed batches again --------------
class _KillOnAckProxy(http.server.ThreadingHTTPServer):
    """Forwards HTTP to the service; the first POST .../ack SIGKILLs the trainer process instead (the
    instant after its checkpoint was written, before the service heard of the ack)."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.victim, self.killed = upstream, None, threading.Event()
        self.http = httpx.Client(base_url=upstream, timeout=60)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _forward(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else None
                if self.command == "POST" and self.path.split("?")[0].endswith("/ack") and proxy.victim:
                    proxy.victim.send_signal(signal.SIGKILL)
                    proxy.killed.set()
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                r = proxy.http.request(self.command, self.path, content=body, headers=headers)
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() in ("content-type",):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = _forward

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


# Attack: a trainer SIGKILLed between checkpoint and ack trained the checkpointed batches again.
def test_sigkill_between_checkpoint_and_ack_does_not_train_twice(live_server, tmp_path):
    """save_every=3: steps 1-3 train three batches, the checkpoint holding all three updates is written,
    then the trainer is killed before its ack reaches the service. Nothing records which batches the
    checkpoint contains, so their leases expire and the resumed trainer trains the same three groups a
    second time (the update is applied twice; versions 4-6 repeat 1-3's data)."""
    from trainer.checkpoint import latest_checkpoint, load_trainer_state
    from trainer.worker import TrainerConfig, run, tiny_model_config

    model = tiny_model_config(vocab_size=512)
    with CuratorClient(live_server.url) as c:
        for i in range(3):
            c.post_group(make_group(f"ck-{i}", prompt_id=f"ckp{i}", answers=["42", "41", "42", "0"]))
    with Scorer() as scorer:
        assert drain(make_sessionmaker(get_engine(live_server.db_url)), scorer).ready == 3

    ckpt = tmp_path / "ckpt"
    lease_s = 6.0
    proxy = _KillOnAckProxy(live_server.url)
    threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    sets = {"service_url": proxy.url, "trainer_id": "ckack", "max_groups": 1, "wait_seconds": 0.5, "lr": 0.01,
            "lease_seconds": lease_s, "checkpoint_dir": str(ckpt), "save_every": 3, "model_config": model}
    cmd = [sys.executable, "-m", "trainer.worker"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy.victim = proc
    try:
        assert proxy.killed.wait(240), "the trainer never reached its first ack"
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proxy.shutdown()
        proxy.server_close()
        proxy.http.close()
    assert load_trainer_state(latest_checkpoint(ckpt)).policy_version == 3  # all three updates are durable

    # the resumed trainer polls until past the moment the killed one's leases expire (read from the service's
    # database: at most lease_s after the kill, not a fixed 2 x lease_s), plus the service's lease_wait_check_s
    # (a long poll hears of groups an expiry released within that) and two polls more: had the checkpoint not
    # settled them, their groups would come back to it then and be trained a second time
    wait_s = 1.0
    left = _lease_time_left(live_server.db_url, "ckack") + Settings.model_fields["lease_wait_check_s"].default
    cfg = TrainerConfig(service_url=live_server.url, trainer_id="ckack", model_config=model, lr=0.01,
                        max_groups=1, wait_seconds=wait_s, max_idle_polls=2 + math.ceil(left / wait_s),
                        lease_seconds=lease_s, checkpoint_dir=str(ckpt), save_every=3)
    with CuratorClient(live_server.url) as client:
        history = run(cfg, client, max_steps=6)
        # the checkpoint already holds the updates of ck-0..ck-2: nothing is left to train
        assert len(history) == 0, f"the resumed trainer trained {len(history)} checkpointed batches again"
        assert client.get_policy()["version"] == 3
        assert sorted(g["id"] for g in client.list_groups(status="consumed")["groups"]) == ["ck-0", "ck-1", "ck-2"]

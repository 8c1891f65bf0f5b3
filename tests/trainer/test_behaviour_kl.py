"""behaviour_kl: the trainer's k3 estimate of KL(pi_sampler || pi_old), published with each policy version
and read by the service's behaviour_mismatch monitor (issue 24, docs/alerts.md)."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from reward_models.scoring import Scorer
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group
from trainer.loss import LossConfig, behaviour_kl, policy_loss
from trainer.worker import TrainerConfig, build_model, run, tiny_model_config


def test_behaviour_kl_is_k3_over_the_tokens_with_sampler_logprobs():
    # two sequences of 3 tokens; the second has no sampler log-probs (behaviour_rows False)
    old = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, -1.0]])
    beh = torch.tensor([[-1.5, -2.0, float("nan")], [9.0, 9.0, 9.0]])  # NaN at a masked position
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    rows = torch.tensor([True, False])
    k3 = math.exp(0.5) - 1 - 0.5  # log r = -0.5: exp(0.5) - 1 + (-0.5)
    per_tok = behaviour_kl(old, beh, mask)
    assert per_tok[0].tolist() == pytest.approx([k3, 0.0, 0.0])
    for tis_cap in (None, 2.0):  # measured with or without truncated IS
        _, m = policy_loss(old.clone().requires_grad_(), old, torch.ones(2), mask, LossConfig(tis_cap=tis_cap),
                           behaviour_logp=beh, behaviour_rows=rows)
        assert float(m["behaviour_kl"]) == pytest.approx((k3 + 0.0) / 2)  # 2 tokens of the first row
    _, none = policy_loss(old.clone().requires_grad_(), old, torch.ones(2), mask, LossConfig(),
                          behaviour_logp=beh, behaviour_rows=torch.tensor([False, False]))
    assert "behaviour_kl" not in none  # no token with sampler log-probs: absent, not 0


def _sampler_logprobs(model, token_ids: list[int], mask: list[int], shift: float) -> list[float]:
    """The log-probs a sampler with these exact weights reports, each mask-1 token's shifted by ``shift``."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([token_ids])).logits[0].float()  # (T, V)
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(token_ids[1:])[:, None])[:, 0]  # (T-1,)
    return [0.0] + [float(lp) + shift if m else 0.0 for lp, m in zip(logp.tolist(), mask[1:], strict=True)]


def _post(server, model, prefix: str, n: int, shift: float) -> None:
    with CuratorClient(server.url) as c:
        for i in range(n):
            g = make_group(f"{prefix}-{i}", prompt_id=f"{prefix}p-{i}", answers=["42", "41", "42", "0"])
            for t in g["trajectories"]:
                t["logprobs"] = _sampler_logprobs(model, t["token_ids"], t["loss_mask"], shift)
            c.post_group(g)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(make_sessionmaker(get_engine(server.db_url)), scorer).ready == n


def test_the_real_trainer_publishes_behaviour_kl_and_a_perturbed_sampler_trips_the_breaker(live_server):
    # lr 0: the weights never move, so pi_old is the sampler's policy at every version unless perturbed
    cfg = TrainerConfig(service_url=live_server.url, trainer_id="t-kl", model_config=tiny_model_config(vocab_size=512),
                        lr=0.0, max_groups=1, wait_seconds=0.5, max_idle_polls=1, device="cpu")
    sampler = build_model(cfg).eval()  # the same seed: the trainer's initial weights
    http = httpx.Client(base_url=live_server.url, timeout=30)
    r = http.put("/v1/monitors/behaviour_mismatch", json={"dataset": None, "warning": 0.005, "critical": 0.02,
                                                          "action": "pause_leases"})
    assert r.status_code == 200, r.text
    with CuratorClient(live_server.url) as client:
        _post(live_server, sampler, "same", 3, shift=0.0)
        assert len(run(cfg, client, max_steps=3)) == 3
        history = {v["version"]: v["metrics"] for v in client.policy_history()["versions"]}
        assert sorted(history) == [1, 2, 3]
        for v in (1, 2, 3):
            assert history[v]["behaviour_kl"] == pytest.approx(0.0, abs=1e-6)
        r = http.post("/v1/alerts/evaluate")
        assert r.status_code == 200, r.text
        assert not [t for t in r.json()["transitions"] if t["alert"]["monitor"] == "behaviour_mismatch"]

        _post(live_server, sampler, "off", 3, shift=-0.5)  # the sampler reports every token 0.5 nats lower
        assert len(run(cfg, client, max_steps=3)) == 3
        history = {v["version"]: v["metrics"] for v in client.policy_history()["versions"]}
        k3 = math.exp(0.5) - 1 - 0.5  # log(pi_sampler / pi_old) = -0.5 on every trained token
        for v in (4, 5, 6):
            assert history[v]["behaviour_kl"] == pytest.approx(k3, rel=1e-4)
        r = http.post("/v1/alerts/evaluate")
        assert r.status_code == 200, r.text
        (t,) = [t for t in r.json()["transitions"] if t["alert"]["monitor"] == "behaviour_mismatch"]
        assert t["to"] == "critical" and t["alert"]["dataset"] is None
        assert t["alert"]["value"] == pytest.approx(k3, rel=1e-4)
        assert t["alert"]["evidence"]["behaviour_kl"][-3:] == pytest.approx([k3] * 3, rel=1e-4)
    lease = http.post("/v1/batches/lease", json={"trainer_id": "t-kl", "max_groups": 1})
    assert lease.status_code == 503 and lease.json()["detail"]["alert"]["monitor"] == "behaviour_mismatch"
    http.close()

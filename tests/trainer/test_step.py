"""The training step on a tiny random Qwen2: it learns, masks remove tokens, accumulation and data
parallelism give the update of one big batch, checkpoints round-trip weights and policy version."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer import ddp_worker
from tests.trainer.batches import make_batch, tiny_config, tiny_model
from trainer.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_model_weights,
    load_optimizer_state,
    load_trainer_state,
    save_checkpoint,
)
from trainer.loss import LossConfig
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step
from trainer.worker import TrainerConfig, _setup, config_from_args

ROOT = Path(__file__).resolve().parents[2]


def _train(batch, cfg=None, budget=10_000, mode="pad", optim="sgd", model=None, ref=None):
    """One step from the seed-0 tiny model -> (state dict after, metrics)."""
    model = model or tiny_model()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.5)
        if optim == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    )
    metrics = train_step(
        PolicyLogprobs(model, 6), opt, pack_batch(batch, budget, mode), cfg or StepConfig(), ref
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def _assert_same(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=k)


def test_a_step_changes_the_parameters_and_reports_metrics():
    before = tiny_model().state_dict()
    after, metrics = _train(make_batch(), optim="adamw")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before)
    for key in ("loss", "pg_loss", "clip_frac_low", "clip_frac_high", "approx_kl", "entropy", "grad_norm"):
        assert torch.isfinite(torch.tensor(metrics[key])), key
    assert metrics["grad_norm"] > 0 and metrics["skipped"] == 0.0


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_masked_tokens_are_truly_removed(optim):
    batch = make_batch(seed=1)
    dirty = copy.deepcopy(batch)
    for traj in dirty["groups"][0]["trajectories"]:  # garbage wherever the loss mask is 0
        traj["logprobs"] = [
            lp if m else -1e9 for lp, m in zip(traj["logprobs"], traj["loss_mask"], strict=True)
        ]
        traj["token_ids"] += [3, 4, 5]  # trailing tokens after the response (e.g. a final observation)
        traj["loss_mask"] += [0, 0, 0]
        traj["logprobs"] += [float("nan")] * 3
    extra = {
        "index": 99,
        "token_ids": [1, 2, 3, 4, 5, 6],
        "loss_mask": [0] * 6,
        "logprobs": [-50.0] * 6,
        "advantage": 5.0,
        "total_reward": 1.0,
    }
    dirty["groups"][1]["trajectories"].append(extra)  # a fully masked trajectory
    for agg in ("token-mean", "seq-mean-token-mean"):
        cfg = StepConfig(loss=LossConfig(agg=agg))
        _assert_same(_train(dirty, cfg, optim=optim)[0], _train(batch, cfg, optim=optim)[0])


def test_an_unmasked_token_does_change_the_update():
    batch = make_batch(seed=1)
    other = copy.deepcopy(batch)
    traj = other["groups"][0]["trajectories"][0]
    i = traj["loss_mask"].index(1)
    traj["logprobs"][i] -= 0.01
    a, b = _train(batch)[0], _train(other)[0]
    assert any(not torch.allclose(a[k], b[k]) for k in a)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_accumulation_and_packing_give_the_update_of_one_big_batch(agg):
    batch = make_batch(n_groups=3, group_size=4, seed=2)
    cfg = StepConfig(loss=LossConfig(agg=agg), max_grad_norm=0.3)
    whole, m_whole = _train(batch, cfg, budget=10_000)
    assert len(pack_batch(batch, 20, "pad")) > 4
    for budget, mode in [(20, "pad"), (20, "pack"), (10_000, "pack")]:
        parts, m_parts = _train(batch, cfg, budget=budget, mode=mode)
        _assert_same(parts, whole, atol=2e-6)
        assert m_parts["loss"] == pytest.approx(m_whole["loss"], rel=1e-4)
        assert m_parts["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-4)


def test_trainer_old_logprobs_with_tis_and_reference_kl():
    batch = make_batch(seed=3)
    ref = PolicyLogprobs(tiny_model().requires_grad_(False), 6)
    cfg = StepConfig(loss=LossConfig(beta=0.1, tis_cap=2.0), old_from_batch=False)
    after, metrics = _train(batch, cfg, ref=ref)
    assert metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the reference is the initial policy
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)  # old policy == current weights
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert 0 < metrics["tis_weight"] <= 2.0
    with pytest.raises(ValueError, match="ref_policy"):
        _train(batch, StepConfig(loss=LossConfig(beta=0.1)))


def test_pi_old_is_recomputed_by_default_and_tis_weights_are_capped():
    batch = make_batch(seed=4)
    for group in batch["groups"]:  # a sampler far from the trainer: behaviour log-probs 3 nats too low
        for traj in group["trajectories"]:
            traj["logprobs"] = [lp - 3.0 if m else lp for lp, m in zip(traj["logprobs"], traj["loss_mask"], strict=True)]
    assert StepConfig().old_from_batch is False and TrainerConfig(model_config={}).old_from_batch is False
    _, metrics = _train(batch)  # defaults
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)  # pi_old == the trainer's weights
    assert metrics["tis_weight"] == pytest.approx(2.0)  # exp(>= 2.6) on every token, capped at 2
    assert metrics["behaviour_mismatch"] > 2.5  # mean |log pi_old - log pi_behaviour|
    _, trusted = _train(batch, StepConfig(old_from_batch=True))  # the sampler's numbers as pi_old
    assert trusted["approx_kl"] > 1.0 and "tis_weight" not in trusted


def test_nothing_to_train_skips_the_step():
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    from trainer.packing import empty_micro_batch

    opt = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.5)
    metrics = train_step(PolicyLogprobs(model), opt, [empty_micro_batch()], StepConfig())
    assert metrics["skipped"] == 1.0
    _assert_same(model.state_dict(), before, atol=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_and_fsdp_equal_one_process_on_the_combined_batch(tmp_path):
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": "2",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", "-m", "tests.trainer.ddp_worker", str(tmp_path)],
            cwd=ROOT,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=240)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    for name, (_, agg, _, _) in ddp_worker.SCENARIOS.items():
        want, m_want = ddp_worker.single_process(agg)
        got = torch.load(tmp_path / f"{name}.pt")
        _assert_same(got, want, atol=2e-6)
        m_got = json.loads((tmp_path / f"{name}.json").read_text())
        assert m_got["grad_norm"] == pytest.approx(m_want["grad_norm"], rel=1e-4), name
        assert m_got["loss"] == pytest.approx(m_want["loss"], rel=1e-4, abs=1e-7), name
        assert m_got["loss_tokens"] == m_want["loss_tokens"], name


def test_checkpoint_round_trip_keeps_weights_optimizer_and_version(tmp_path):
    model = tiny_model(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(PolicyLogprobs(model), opt, pack_batch(make_batch(), 10_000), StepConfig())
    save_checkpoint(tmp_path, model, opt, TrainerState(policy_version=7, step=3))
    path = save_checkpoint(tmp_path, model, opt, TrainerState(policy_version=12, step=8))
    (tmp_path / "step-00000099.tmp").mkdir()  # an interrupted save is not a checkpoint
    assert latest_checkpoint(tmp_path) == path
    assert (tmp_path / "step-00000003").is_dir()
    save_checkpoint(tmp_path, model, opt, TrainerState(policy_version=13, step=9), keep_last=2)
    assert not (tmp_path / "step-00000003").exists() and latest_checkpoint(tmp_path).name == "step-00000009"
    assert load_trainer_state(path) == TrainerState(policy_version=12, step=8)

    fresh = tiny_model(seed=2)
    load_model_weights(path, fresh)
    _assert_same(fresh.state_dict(), model.state_dict(), atol=0)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight  # still tied
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    load_optimizer_state(path, fresh, fresh_opt)
    for p_old, p_new in zip(model.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(fresh_opt.state[p_new]["exp_avg"], opt.state[p_old]["exp_avg"])

    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path)  # a sampler can load it directly
    _assert_same(loaded.state_dict(), model.state_dict(), atol=0)


def test_setup_resumes_from_the_last_checkpoint(tmp_path):
    cfg = tiny_config(checkpoint_dir=str(tmp_path), initial_policy_version=4)
    _, model, _, opt, state = _setup(cfg)
    assert state == TrainerState(policy_version=4, step=0)
    train_step(PolicyLogprobs(model), opt, pack_batch(make_batch(), 10_000), StepConfig())
    save_checkpoint(tmp_path, model, opt, TrainerState(policy_version=5, step=1))
    _, resumed, _, resumed_opt, state = _setup(cfg)
    assert state == TrainerState(policy_version=5, step=1)
    _assert_same(resumed.state_dict(), model.state_dict(), atol=0)
    assert len(resumed_opt.state) == len(opt.state)


def test_config_from_args_and_validation(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"model": "/models/x", "lr": 1e-5, "loss": {"agg": "seq-mean-token-sum"}}))
    cfg, steps = config_from_args(
        ["--config", str(path), "--set", "loss.beta=0.04", "--set", "trainer_id=t7", "--max-steps", "3"]
    )
    assert (cfg.lr, cfg.trainer_id, steps) == (1e-5, "t7", 3)
    assert cfg.loss == LossConfig(agg="seq-mean-token-sum", beta=0.04)
    with pytest.raises(ValueError, match="valid"):
        TrainerConfig.from_dict({"model": "x", "learning_rate": 1.0})
    with pytest.raises(ValueError, match="pad, pack"):
        TrainerConfig(model="x", pack_mode="bins")
    with pytest.raises(ValueError, match="exactly one"):
        TrainerConfig()
    with pytest.raises(ValueError, match="one of max_groups"):
        TrainerConfig(model="x", max_groups=2, max_tokens=4096)
    assert TrainerConfig(model="x").max_groups == 8
    assert TrainerConfig(model="x", max_tokens=4096).max_groups is None
    # max_staleness follows the checkpoint cadence the producers load: newest or previous checkpoint
    assert TrainerConfig(model="x", checkpoint_dir="/c", save_every=5).max_staleness == 10
    assert TrainerConfig(model="x").max_staleness is None  # no checkpoints: producers cannot follow
    assert TrainerConfig(model="x", checkpoint_dir="/c", max_staleness=None).max_staleness is None
    assert TrainerConfig(model="x", checkpoint_dir="/c", max_staleness=3).max_staleness == 3
    for bad in ("soon", -1):
        with pytest.raises(ValueError, match="max_staleness"):
            TrainerConfig(model="x", max_staleness=bad)

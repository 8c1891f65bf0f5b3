"""How a batch is trained: trajectories without sampler log-probs, and several updates per batch.

A batch with `logprobs: null` (ingest accepts it; delivery lets it through when pi_old is recomputed)
trains, with no behaviour policy for those trajectories, instead of crashing the trainer into a poison
loop. `ppo_epochs` / `mini_batches` take several optimizer steps per batch with pi_old fixed.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from tests.trainer.batches import make_batch, tiny_model
from trainer.delivery import unusable
from trainer.loss import LossConfig
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs, frozen_logprobs
from trainer.step import StepConfig, train_step


def _without_logprobs(batch, every: int = 1):
    """A copy of `batch` where every `every`-th trajectory has logprobs null."""
    batch = copy.deepcopy(batch)
    trajs = [t for g in batch["groups"] for t in g["trajectories"]]
    for i, t in enumerate(trajs):
        if i % every == 0:
            t["logprobs"] = None
    return batch


def _step(batch, cfg=StepConfig(), lr=0.5, model=None):
    model = model or tiny_model()
    metrics = train_step(PolicyLogprobs(model, 6), torch.optim.SGD(model.parameters(), lr=lr),
                         pack_batch(batch, 10_000), cfg)
    return model, metrics


def test_a_batch_without_logprobs_trains_with_no_behaviour_policy():
    before = tiny_model().state_dict()
    model, metrics = _step(_without_logprobs(make_batch(seed=3)))
    assert metrics["skipped"] == 0.0 and metrics["updates"] == 1.0
    assert "behaviour_mismatch" not in metrics and "tis_weight" not in metrics  # absent, not 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_mixed_batch_reports_the_mismatch_of_the_trajectories_that_have_logprobs_only():
    batch = make_batch(seed=4)
    mixed = _without_logprobs(batch, every=2)
    kept = copy.deepcopy(mixed)
    for g in kept["groups"]:
        g["trajectories"] = [t for t in g["trajectories"] if t["logprobs"] is not None]
    _, m_mixed = _step(mixed, lr=0.0)
    _, m_kept = _step(kept, lr=0.0)
    assert m_mixed["behaviour_mismatch"] == pytest.approx(m_kept["behaviour_mismatch"], rel=1e-6)
    assert m_mixed["tis_weight"] == pytest.approx(m_kept["tis_weight"], rel=1e-6)
    assert m_mixed["loss_tokens"] > m_kept["loss_tokens"]  # the others still train


def test_trajectories_without_logprobs_get_tis_weight_one():
    """With the sampler's log-probs replaced by pi_old's own, TIS is 1 everywhere: trajectories without
    log-probs must train exactly like that (weight 1), not with a weight from a placeholder 0."""
    batch = _without_logprobs(make_batch(seed=6))
    model = tiny_model()
    policy = PolicyLogprobs(model, 6)
    mbs = pack_batch(batch, 10_000)
    exact = [replace(mb, old_logp=frozen_logprobs(policy, mb), has_behaviour=None) for mb in mbs]
    a, b = tiny_model(), tiny_model()
    train_step(PolicyLogprobs(a, 6), torch.optim.SGD(a.parameters(), lr=0.5), mbs, StepConfig())
    train_step(PolicyLogprobs(b, 6), torch.optim.SGD(b.parameters(), lr=0.5), exact, StepConfig())
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, b.state_dict()[k], atol=1e-6, rtol=1e-5, msg=k)


def test_old_from_batch_refuses_a_batch_without_logprobs_with_a_reason():
    batch = _without_logprobs(make_batch(seed=3), every=3)
    assert "no behaviour logprobs" in unusable(batch, need_logprobs=True)
    assert unusable(batch, need_logprobs=False) is None
    with pytest.raises(ValueError, match="old_from_batch"):
        _step(batch, StepConfig(old_from_batch=True))


def _fixed_old(policy, mbs):
    """The micro-batches with their old log-probs set to pi_old of `policy` now (as old_from_batch reads)."""
    return [replace(mb, old_logp=frozen_logprobs(policy, mb)) for mb in mbs]


@pytest.mark.parametrize(("epochs", "minis"), [(2, 1), (3, 1), (1, 2), (2, 2)])
def test_several_updates_per_batch_keep_pi_old_fixed(epochs, minis):
    """ppo_epochs x mini_batches updates == that many single updates that all read pi_old of the weights
    before the first one (so the ratio moves away from 1 and clipping engages)."""
    batch = make_batch(n_groups=4, group_size=4, seed=7)
    loss = LossConfig(tis_cap=None)
    mbs = pack_batch(batch, 40)  # several micro-batches, so mini-batches have something to split
    assert len(mbs) >= 2 * minis
    a = tiny_model()
    metrics = train_step(PolicyLogprobs(a, 6), torch.optim.SGD(a.parameters(), lr=2.0), mbs,
                         StepConfig(loss=loss, ppo_epochs=epochs, mini_batches=minis))
    b = tiny_model()
    pb, opt_b = PolicyLogprobs(b, 6), torch.optim.SGD(b.parameters(), lr=2.0)
    fixed = _fixed_old(pb, mbs)
    bounds = [round(i * len(fixed) / minis) for i in range(minis + 1)]
    for _ in range(epochs):
        for i in range(minis):
            train_step(pb, opt_b, fixed[bounds[i] : bounds[i + 1]], StepConfig(loss=loss, old_from_batch=True))
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, b.state_dict()[k], atol=1e-5, rtol=1e-4, msg=k)
    assert metrics["updates"] == epochs * minis
    assert metrics["ratio_max"] > 1.0 + 1e-3  # later updates see the policy moved from pi_old
    assert metrics["clip_frac_low"] + metrics["clip_frac_high"] > 0


def test_one_update_per_batch_is_the_default_and_has_ratio_one():
    _, metrics = _step(make_batch(seed=8), StepConfig(loss=LossConfig(tis_cap=None)))
    assert metrics["updates"] == 1.0
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_ppo_epochs_and_mini_batches_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match="ppo_epochs"):
        StepConfig(ppo_epochs=bad)
    with pytest.raises(ValueError, match="mini_batches"):
        StepConfig(mini_batches=bad)

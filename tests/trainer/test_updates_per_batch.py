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
from trainer.packing import pack_batch, pack_mini_batches, sequences_from_batch, split_mini_batches
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


def _quarters(batch: dict, parts: int) -> list[dict]:
    """`batch` cut into `parts` batches of consecutive trajectories (in batch order), near-equal counts."""
    flat = [(g, t) for g in batch["groups"] for t in g["trajectories"]]
    bounds = [round(i * len(flat) / parts) for i in range(parts + 1)]
    out = []
    for k in range(parts):
        groups: dict[str, dict] = {}
        for g, t in flat[bounds[k] : bounds[k + 1]]:
            groups.setdefault(g["id"], {**g, "trajectories": []})["trajectories"].append(t)
        out.append({"groups": list(groups.values())})
    return out


@pytest.mark.parametrize(("epochs", "minis", "budget"), [(2, 1, 40), (3, 1, 40), (1, 2, 40), (2, 2, 40),
                                                         (1, 4, 10_000), (2, 3, 10_000), (1, 4, 40)])
def test_several_updates_per_batch_keep_pi_old_fixed(epochs, minis, budget):
    """ppo_epochs x mini_batches updates == that many single updates, on the batch cut by trajectories into
    `minis` consecutive parts, that all read pi_old of the weights before the first one (so the ratio moves
    away from 1 and clipping engages) -- also when the whole batch is one micro-batch (budget 10 000: the
    mini-batches split trajectories, not micro-batches)."""
    batch = make_batch(n_groups=4, group_size=4, seed=7)
    loss = LossConfig(tis_cap=None)
    if budget == 10_000:
        assert len(pack_batch(batch, budget)) == 1
    a = tiny_model()
    metrics = train_step(PolicyLogprobs(a, 6), torch.optim.SGD(a.parameters(), lr=2.0),
                         pack_mini_batches(batch, minis, budget),
                         StepConfig(loss=loss, ppo_epochs=epochs, mini_batches=minis))
    b = tiny_model()
    pb, opt_b = PolicyLogprobs(b, 6), torch.optim.SGD(b.parameters(), lr=2.0)
    parts = [_fixed_old(pb, pack_batch(q, budget)) for q in _quarters(batch, minis)]  # pi_old of b's start
    for _ in range(epochs):
        for part in parts:
            train_step(pb, opt_b, part, StepConfig(loss=loss, old_from_batch=True))
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, b.state_dict()[k], atol=1e-5, rtol=1e-4, msg=k)
    assert metrics["updates"] == epochs * minis and metrics["mini_batches"] == minis
    assert metrics["loss_tokens"] == sum(float(mb.loss_mask.sum()) for mb in pack_batch(batch, budget))
    if epochs * minis > 1:
        assert metrics["ratio_max"] > 1.0 + 1e-3  # later updates see the policy moved from pi_old
        assert metrics["clip_frac_low"] + metrics["clip_frac_high"] > 0


def test_more_mini_batches_than_trajectories_take_one_update_per_trajectory_and_say_so():
    """mini_batches is the most updates an epoch takes: 5 mini-batches of 3 trajectories are 3 updates of one
    trajectory each (the `mini_batches` metric records 3), the same as mini_batches=3."""
    batch = make_batch(n_groups=1, group_size=3, seed=2)
    got = {}
    for minis in (3, 5):
        model = tiny_model()
        got[minis] = train_step(PolicyLogprobs(model, 6), torch.optim.SGD(model.parameters(), lr=2.0),
                                pack_mini_batches(batch, minis, 10_000),
                                StepConfig(loss=LossConfig(tis_cap=None), mini_batches=minis)), model
    assert got[5][0]["updates"] == 3.0 and got[5][0]["mini_batches"] == 3.0
    for k, v in got[5][1].state_dict().items():
        torch.testing.assert_close(v, got[3][1].state_dict()[k], atol=0, rtol=0, msg=k)


def test_mini_batches_never_split_a_segmented_trajectory_and_a_flat_list_is_refused():
    import random

    from tests.trainer.batches import make_trajectory
    from tests.trainer.test_segments import _batch, _segmented

    rng = random.Random(5)
    trajs = [_segmented(make_trajectory(rng, i, 2, 3), [make_trajectory(rng, i, 2, 3) for _ in range(3)])
             for i in range(3)]
    seqs = sequences_from_batch(_batch(*trajs))
    parts = split_mini_batches(seqs, 2)
    assert [len(p) for p in parts] == [3, 3] or [len(p) for p in parts] == [6, 3] or [len(p) for p in parts] == [3, 6]
    assert all(len({q.unit for q in p}) == len(p) // 3 for p in parts)  # whole trajectories only
    model = tiny_model()
    with pytest.raises(ValueError, match="pack_mini_batches"):
        train_step(PolicyLogprobs(model, 6), torch.optim.SGD(model.parameters(), lr=1.0),
                   pack_batch(make_batch(), 10_000), StepConfig(mini_batches=2))


def test_a_non_finite_update_after_a_finite_one_keeps_the_applied_update_and_says_so():
    """ppo_epochs=2 with a learning rate that makes the second update's loss non-finite: the first update's
    weights stand (equal to one single update), the metrics are the first update's with nonfinite_updates 1,
    skipped 0, updates 1; a first update that is already non-finite is skipped (weights untouched)."""
    batch = make_batch(seed=3)
    cfg = StepConfig(ppo_epochs=2, max_grad_norm=None)
    a = tiny_model()
    got = train_step(PolicyLogprobs(a, 6), torch.optim.SGD(a.parameters(), lr=1e25), pack_batch(batch, 10_000), cfg)
    b = tiny_model()
    one = train_step(PolicyLogprobs(b, 6), torch.optim.SGD(b.parameters(), lr=1e25), pack_batch(batch, 10_000),
                     StepConfig(max_grad_norm=None))
    assert got["updates"] == 1.0 and got["skipped"] == 0.0 and got["nonfinite_updates"] == 1.0
    assert "nonfinite" not in got
    assert got["loss"] == one["loss"] and got["grad_norm"] == one["grad_norm"]
    assert got["loss_tokens"] == one["loss_tokens"]
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
        assert bool(torch.isfinite(v).all()), k
    c = tiny_model()
    before = {k: v.clone() for k, v in c.state_dict().items()}
    hot = copy.deepcopy(batch)
    for g in hot["groups"]:
        g["temperature"] = 1e-40  # logits / 1e-40 overflow: the very first update is non-finite
    first = train_step(PolicyLogprobs(c, 6), torch.optim.SGD(c.parameters(), lr=0.5),
                       pack_batch(hot, 10_000), StepConfig(ppo_epochs=2, max_grad_norm=None, autocast=False))
    assert first["skipped"] == 1.0 and first["nonfinite"] == 1.0 and first["updates"] == 0.0
    assert all(torch.equal(v, before[k]) for k, v in c.state_dict().items())


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


def test_the_worker_packs_its_rank_batch_into_mini_batches_of_trajectories():
    """trainer.worker.micro_batches: `mini_batches` lists of micro-batches, every trajectory once; a rank with
    no batch (or nothing trainable) gets that many empty mini-batches, so ranks run the same steps."""
    from tests.trainer.batches import tiny_config
    from trainer.worker import micro_batches

    cfg = tiny_config(mini_batches=4, micro_token_budget=10_000)
    batch = make_batch(n_groups=2, group_size=3, seed=1)
    parts = micro_batches(batch, cfg)
    assert len(parts) == 4 and all(len(p) == 1 for p in parts)
    assert sum(p[0].advantages.shape[0] for p in parts) == 6
    for empty in (None, {"groups": [{**g, "trajectories": [{**t, "loss_mask": [0] * len(t["loss_mask"])}
                                                          for t in g["trajectories"]]} for g in batch["groups"]]}):
        parts = micro_batches(empty, cfg)
        assert len(parts) == 4 and all(float(p[0].loss_mask.sum()) == 0 for p in parts)

"""Leased batch -> micro-batches: shifting, trimming, budgets, and that packed rows really keep
sequences apart (same log-probs as one sequence at a time through the plain transformers forward)."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.batches import make_batch, tiny_model
from trainer.logprobs import token_logprobs_plain
from trainer.packing import pack_batch, pack_sequences, sequences_from_batch
from trainer.policy import PolicyLogprobs, sequence_logprobs


def _batch(*trajs):
    return {
        "batch_id": "b",
        "expires_at": "",
        "groups": [{"id": "g", "prompt_id": "p", "policy_version": 3, "trajectories": list(trajs)}],
    }


def _traj(ids, mask, lps, adv=1.0, index=0):
    return {
        "index": index,
        "token_ids": ids,
        "loss_mask": mask,
        "logprobs": lps,
        "advantage": adv,
        "total_reward": 0.0,
    }


def test_shift_and_trim_by_hand():
    traj = _traj([5, 6, 7, 8, 9, 10], [0, 0, 1, 0, 1, 0], [0.0, 0.0, -0.5, 0.0, -1.5, 0.0], adv=-2.0)
    (seq,) = sequences_from_batch(_batch(traj))
    assert seq.inputs == [5, 6, 7, 8]  # stops at the last mask-1 target (9); 10 is dropped
    assert seq.targets == [6, 7, 8, 9]
    assert seq.loss_mask == [0.0, 1.0, 0.0, 1.0]
    assert seq.old_logp == [0.0, -0.5, 0.0, -1.5]
    assert seq.advantage == -2.0 and seq.policy_version == 3


def test_trajectories_with_nothing_to_train_are_left_out():
    nothing = _traj([1, 2, 3], [0, 0, 0], [0.0, 0.0, 0.0])
    first_only = _traj([1, 2], [1, 0], [-1.0, 0.0])  # token 0 has no context: never trained
    one = _traj([1, 2], [0, 1], [0.0, -1.0])
    assert [s.inputs for s in sequences_from_batch(_batch(nothing, first_only, one))] == [[1]]


def test_length_mismatch_names_the_trajectory():
    with pytest.raises(ValueError, match="trajectory 4"):
        sequences_from_batch(_batch(_traj([1, 2, 3], [0, 1], [0.0, -1.0], index=4)))


def _key(inputs, targets, mask, old, adv):
    return (tuple(inputs), tuple(targets), tuple(mask), tuple(round(v, 4) for v in old), round(adv, 4))


@pytest.mark.parametrize("mode", ["pad", "pack"])
@pytest.mark.parametrize("budget", [1, 16, 40, 10_000])
def test_every_sequence_once_under_the_budget(mode, budget):
    seqs = sequences_from_batch(make_batch(n_groups=4, group_size=5, seed=2))
    mbs = pack_sequences(seqs, budget, mode)
    longest = max(len(s.inputs) for s in seqs)
    seen = []
    for mb in mbs:
        assert mb.input_ids.numel() <= max(budget, longest)
        if mode == "pack":
            assert mb.input_ids.shape[0] == 1 and mb.attention_mask is None
        flat_ids, flat_tgt = mb.input_ids.reshape(-1), mb.targets.reshape(-1)
        for s in range(mb.gather_index.shape[0]):
            n = int((mb.loss_mask[s] != 0).nonzero().max()) + 1  # last mask-1 target ends the sequence
            idx = mb.gather_index[s, :n]
            seen.append(
                _key(
                    flat_ids[idx].tolist(),
                    flat_tgt[idx].tolist(),
                    mb.loss_mask[s, :n].tolist(),
                    mb.old_logp[s, :n].tolist(),
                    float(mb.advantages[s]),
                )
            )
    assert sorted(seen) == sorted(
        _key(s.inputs, s.targets, s.loss_mask, s.old_logp, s.advantage) for s in seqs
    )
    if budget >= 10_000:
        assert len(mbs) == 1


def test_pad_rows_are_sorted_and_masked():
    mbs = pack_batch(make_batch(seed=4), 10_000, "pad")
    (mb,) = mbs
    lengths = mb.attention_mask.sum(-1).tolist()
    assert lengths == sorted(lengths, reverse=True)
    assert mb.n_input_tokens == sum(lengths)
    assert int(mb.input_ids[mb.attention_mask == 0].abs().sum()) == 0


def test_unknown_mode_and_bad_budget_raise():
    seqs = sequences_from_batch(make_batch())
    with pytest.raises(ValueError, match="pad, pack"):
        pack_sequences(seqs, 100, "bucket")
    with pytest.raises(ValueError, match="token_budget"):
        pack_sequences(seqs, 0, "pad")


@torch.no_grad()
def test_packed_and_padded_logprobs_equal_one_sequence_at_a_time():
    model = tiny_model()
    policy = PolicyLogprobs(model, chunk_tokens=7)
    seqs = sequences_from_batch(make_batch(n_groups=2, group_size=4, seed=5))
    want = {}
    for s in seqs:
        logits = model(input_ids=torch.tensor([s.inputs])).logits  # (1, n, V)
        want[tuple(s.inputs)] = token_logprobs_plain(logits, torch.tensor([s.targets]))[0]
    for mode, budget in [("pad", 64), ("pack", 64), ("pack", 10_000)]:
        for mb in pack_sequences(seqs, budget, mode):
            logp, _ = sequence_logprobs(policy, mb)  # (S, Tm)
            flat_ids = mb.input_ids.reshape(-1)
            for s in range(logp.shape[0]):
                n = int((mb.loss_mask[s] != 0).nonzero().max()) + 1
                ref = want[tuple(flat_ids[mb.gather_index[s, :n]].tolist())]
                torch.testing.assert_close(logp[s, :n], ref[:n], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_each_group_is_scored_at_its_own_sampling_temperature():
    model = tiny_model()
    policy = PolicyLogprobs(model, chunk_tokens=7, temperature=1.0)  # the trainer's own setting: unused
    batch = make_batch(n_groups=3, group_size=3, seed=6)
    temps = {batch["groups"][0]["id"]: 0.6, batch["groups"][1]["id"]: 1.7}  # the third says nothing
    for g in batch["groups"]:
        g["temperature"] = temps.get(g["id"])
    by_inputs = {}
    for g in batch["groups"]:
        for s in sequences_from_batch({"groups": [g]}):
            by_inputs[tuple(s.inputs)] = (s, temps.get(g["id"], 1.3))  # 1.3: the default passed below
    for mode in ("pad", "pack"):
        for mb in pack_batch(batch, 64, mode, default_temperature=1.3):
            logp, _ = sequence_logprobs(policy, mb)  # (S, Tm)
            flat_ids = mb.input_ids.reshape(-1)
            for s in range(logp.shape[0]):
                n = int((mb.loss_mask[s] != 0).nonzero().max()) + 1
                seq, temp = by_inputs[tuple(flat_ids[mb.gather_index[s, :n]].tolist())]
                logits = model(input_ids=torch.tensor([seq.inputs])).logits  # (1, n, V)
                want = token_logprobs_plain(logits, torch.tensor([seq.targets]), temp)[0]
                torch.testing.assert_close(logp[s, :n], want[:n], atol=1e-5, rtol=1e-5)
                other = token_logprobs_plain(logits, torch.tensor([seq.targets]), 1.0)[0]
                assert temp == 1.0 or not torch.allclose(logp[s, :n], other[:n], atol=1e-4)
    batch["groups"][2]["temperature"] = 0.0
    with pytest.raises(ValueError, match="temperature"):
        pack_batch(batch, 64)

"""bench/truncation.py at a tiny size: every arm runs the same steps, the JSON has its shape, and the
remedies do what the service's do (resample replaces a cut member once, resume continues it from the
state before the cut turn without the cut tokens, segment trains a cut turn's pieces as segments)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from bench import truncation as tr
from rollout.sampler import Completion, HFSampler
from trainer.worker import TrainerConfig, build_model


@pytest.mark.slow
def test_every_arm_runs_the_same_steps_and_writes_its_json(tmp_path):
    argv = ["--seeds", "2", "--steps", "2", "--groups", "2", "--max-draws", "2", "--eval-samples", "1",
            "--jobs", "2", "--out", str(tmp_path)]
    assert tr.main(argv) == 0
    body = json.loads((tmp_path / "truncation.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in body["runs"]) == sorted((a, s) for a in tr.ARMS for s in (0, 1))
    for r in body["runs"]:
        assert len(r["groups_per_step"]) == 2 and all(0 <= g <= 2 for g in r["groups_per_step"])
        assert 0.0 <= r["final"] <= 1.0 and 0.0 <= r["early_answer"] <= 1.0 and r["answer_length"] >= 1.0
        assert 0 < r["truncated"] <= r["sampled"]  # the tight budget cuts episodes
        if r["arm"] in ("resample", "resume"):
            assert r["remedy_samples"] > 0
        else:
            assert r["remedy_samples"] == 0
    assert [row["arm"] for row in body["summary"]] == list(tr.ARMS)
    for row in body["summary"]:
        for key in ("pass_rate", "answer_length", "early_answer_share", "train_cut_share"):
            assert row[key]["min"] <= row[key]["median"] <= row[key]["max"]


class Scripted:
    """A sampler that answers each call with the next scripted completion (a stand-in for the model, so
    the episode rules are checked exactly)."""

    def __init__(self, script: list[list[int]], budget_seen: list[int]) -> None:
        self.script, self.budgets = list(script), budget_seen

    def sample(self, ctx, n, budget, seed):
        self.budgets.append(budget)
        out = []
        for _ in range(n):
            toks = self.script.pop(0)[:budget]
            out.append(Completion(toks, [-0.5] * len(toks), "stop" if tr.EOS in toks else "length"))
        return out


A, LOOK = tr.TOK.encode("a")[0], tr.LOOKUP
PROMPT = tr.TOK.encode("ab=")


def test_a_lookup_then_an_answer_and_a_cut_second_turn():
    eps = tr.new_episodes(PROMPT, 2)
    # both look up (one call), then the first answers, the second rambles past the budget
    sampler = Scripted([[LOOK, tr.EOS], [LOOK, tr.EOS], [A, tr.EOS], [A, A, A]], [])
    tr.run_episodes(sampler, eps, A, 2, random.Random(0))
    first, second = eps
    assert first.looked and first.finish == "stop" and tr.score(first, "a") == 1.0
    assert first.ids == PROMPT + [LOOK, tr.EOS, A, A, tr.EOS] and first.mask == [0] * 3 + [1, 1, 0, 1, 1]
    assert second.finish == "length" and second.boundary == len(PROMPT) + 3  # before the cut turn
    back = tr.resumed(second)
    assert back.ids == PROMPT + [LOOK, tr.EOS, A] and back.looked and back.turn == 1 and back.resumes == 1


def test_resume_continues_from_the_checkpoint_with_the_larger_budget_at_most_twice():
    eps = [tr.Episode(PROMPT + [LOOK, tr.EOS, A, A, A], [0] * 3 + [1, 1, 0, 1, 1], [0.0] * 8, len(PROMPT) + 3, 1,
                      True, finish="length")]
    budgets: list[int] = []
    sampler = Scripted([[A, A, A, A, A], [A, A, A, A, A]], budgets)  # cut again both times
    out, extra = tr.remedy("resume", eps, PROMPT, A, 2, sampler, random.Random(0))
    assert extra == tr.MAX_RESUMES == 2 and budgets == [4, 4]
    assert out[0].finish == "length" and out[0].resumes == 2
    assert out[0].ids[: len(PROMPT) + 3] == PROMPT + [LOOK, tr.EOS, A]  # the checkpoint kept, no tool run again


def test_resample_replaces_a_cut_member_once_from_scratch():
    eps = [tr.Episode(PROMPT + [A, A], [0, 0, 0, 1, 1], [0.0] * 5, len(PROMPT), finish="length")]
    budgets: list[int] = []
    out, extra = tr.remedy("resample", eps, PROMPT, A, 2, Scripted([[A, A, A, A, A]], budgets), random.Random(0))
    assert extra == 1 and budgets == [4] and out[0].finish == "length" and out[0].ids == PROMPT + [A] * 4


def test_a_cut_turn_goes_on_in_segments_and_trains_as_segments():
    eps = tr.new_episodes(PROMPT, 1)
    sampler = Scripted([[A, A], [tr.EOS]], [])
    tr.run_episodes(sampler, eps, A, 2, random.Random(0), segment=True)
    [ep] = eps
    assert ep.finish == "stop" and ep.segment_ends == [len(PROMPT) + 2] and tr.TOK.decode(ep.answer) == "aa"
    t = tr.to_batch_trajectory(ep, 0, 0.5, None)
    first, second = t["segments"]
    assert first["loss_mask"] == [0] * 3 + [1, 1] and second["token_ids"] == PROMPT + [A, A, tr.EOS]
    assert second["loss_mask"] == [0] * 5 + [1] and {s["advantage"] for s in t["segments"]} == {0.5}


def test_a_tight_budget_cuts_a_young_policy():
    torch.manual_seed(0)
    model = build_model(TrainerConfig(model_config=tr.MODEL, seed=0))
    ev = tr.evaluate(HFSampler(model, tr.EOS, 0), tr.lookup_prompts(), 3, 2, 1)
    assert 0.2 < ev["cut"] < 1.0 and 0.0 <= ev["early"] <= 1.0

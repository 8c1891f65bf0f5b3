"""bench/curation_effect.py end to end on its short path: every arm trains the same steps on the same
number of groups, plain trains on what it draws, and the output (table, JSON, PNG) has its shape."""

from __future__ import annotations

import json

import pytest

from bench import curation_effect as ce

STEPS, GROUPS = 4, 2


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("curation")
    # max_draws 64: a young policy's groups carry signal ~1 in 10, so every curated step fills its 2 groups
    argv = ["--quick", "--seeds", "2", "--steps", str(STEPS), "--groups", str(GROUPS), "--max-draws", "64",
            "--eval-every", "2", "--eval-samples", "2", "--jobs", "2", "--out", str(out)]
    assert ce.main(argv) == 0
    return out, json.loads((out / "curation_effect.json").read_text())


@pytest.mark.slow
def test_every_arm_trains_the_same_steps_on_the_same_number_of_groups(quick_run):
    _, body = quick_run
    runs = body["runs"]
    assert sorted((r["arm"], r["seed"]) for r in runs) == sorted((a, s) for a in ce.ARMS for s in (0, 1))
    for r in runs:
        assert r["groups_per_step"] == [GROUPS] * STEPS, r["arm"]
        assert [e[0] for e in r["evals"]] == [0, 2, 4]
        assert all(0.0 <= e[2] <= 1.0 for e in r["evals"]) and 0.0 <= r["final"] <= 1.0
        assert 0 <= r["truncated"] <= r["sampled"] and 0 <= r["no_signal_groups"] <= r["groups_drawn"]
        assert r["sampled"] == r["groups_drawn"] * ce.GROUP_SIZE
        # every trained group passed the curation; the ready ones past a full batch were discarded
        assert r["ready_groups"] - r["discarded"] == sum(r["groups_per_step"]) and r["discarded"] >= 0
        assert [e[1] for e in r["evals"]] == sorted(e[1] for e in r["evals"])  # samples only grow
        if r["arm"] == "plain":  # GRPO as it comes: exactly the groups it trains on, all-equal ones too
            assert r["groups_drawn"] == r["ready_groups"] == STEPS * GROUPS and r["discarded"] == 0
        else:  # dynamic sampling draws at least the batch, more when groups have no signal
            assert r["groups_drawn"] >= STEPS * GROUPS
    for row in body["summary"]:
        assert row["steps"] == [STEPS] and row["groups_per_step"] == [GROUPS] and row["seeds"] == [0, 1]
        assert row["short_steps"] == [0, 0]
        for t in (0.5, 0.8):
            for key in (f"steps_to_{t}", f"samples_to_{t}"):
                assert row[key]["of"] == 2 and 0 <= row[key]["reached"] <= 2
        assert 0.0 <= row["cut_share"]["min"] <= row["cut_share"]["median"] <= row["cut_share"]["max"] <= 1.0
    # a young policy is cut by the 2-token budget: truncation really happens
    assert all(r["truncated"] > 0 for r in runs)


@pytest.mark.slow
def test_the_plot_is_written_and_a_saved_run_reprints(quick_run, tmp_path, capsys):
    out, body = quick_run
    assert (out / "curation_effect.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert ce.main(["--from-json", str(out / "curation_effect.json"), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert all(arm in printed for arm in ce.ARMS)
    assert (tmp_path / "curation_effect.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "curation_effect.json").exists()  # a re-print writes no raw data


def test_a_seed_that_never_reaches_counts_as_never():
    assert ce.censored_stats([30, None, 10]) == {"reached": 2, "of": 3, "median": 30, "min": 10, "max": None}
    assert ce.censored_stats([None, None, 10])["median"] is None  # most never reached: the median is never
    assert ce.censored_stats([20, 10, 40]) == {"reached": 3, "of": 3, "median": 20, "min": 10, "max": 40}
    assert ce.censored_stats([None, None]) == {"reached": 0, "of": 2, "median": None, "min": None, "max": None}
    assert ce.fmt(ce.censored_stats([30, None, 10])) == "30 [10-never]"


def test_reach_takes_the_first_eval_at_or_over_the_threshold():
    run = ce.Run("plain", 0, evals=[[0, 0, 0.0], [5, 160, 0.5], [10, 320, 0.9]])
    assert ce.reach(run, 0.5) == (5, 160) and ce.reach(run, 0.8) == (10, 320) and ce.reach(run, 0.95) is None


def test_the_impossible_prompts_never_fit_the_budget():
    prompts, learnable, budget = ce.task_prompts("letter-map")
    impossible = [p for p in prompts if p not in learnable]
    assert len(learnable) == 16 and len(impossible) == 8
    assert all(len(p["reference"]["answer"]) + 1 > budget for p in impossible)  # answer + EOS
    assert all(len(p["reference"]["answer"]) + 1 <= budget for p in learnable)
    assert len({p["id"] for p in prompts}) == len(prompts)

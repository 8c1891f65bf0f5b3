"""Resume from the last complete state, through real processes: a member cut by the budget makes its group
wait with a resume request carrying its checkpoint; the API server is killed and restarted; the producer
continues the episode from the checkpoint under a moved policy and fills the slot; the continuation's
tokens carry the new version, and the trainer's TIS weights of the checkpoint's tokens are not 1."""

from __future__ import annotations

import signal

import pytest
import torch

from rollout.episodes import continue_episode
from rollout.producer import Policy, RolloutConfig, build_group, fill_slots
from rollout.sampler import HFSampler
from rollout.tasks import DEMO_ALPHABET, letter_sum_prompts, letter_sum_spec, load_tokenizer
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.conftest import start_server, stop_server
from trainer.loss import tis_weights
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs, frozen_logprobs
from trainer.step import StepConfig, _freeze
from trainer.worker import TrainerConfig, build_model, tiny_model_config

CONFIG = tiny_model_config(vocab_size=3 + len(DEMO_ALPHABET))


def set_up_resume(url: str) -> None:
    """The letter-sum task with a policy that resumes a member cut by length (once, waiting an hour)."""
    with CuratorClient(url) as c:
        c.upsert_prompts(letter_sum_prompts())
        c.create_reward_spec(letter_sum_spec())
        c.create_curation_policy({"name": "resume", "finish_reason_actions": {"length": "resume"},
                                  "resample_wait_seconds": 3600, "max_resumes": 1})
        c.set_dataset("letter-sum", reward_spec="letter-sum", curation_policy="resume")


def test_resume_across_an_api_restart_tags_versions_and_weighs_the_old_part(fresh_db, tmp_path, scorer):
    server = start_server(fresh_db)
    try:
        set_up_resume(server.url)
        cfg = RolloutConfig(service_url=server.url, producer_id="p1", run_id="r", seed=1, model_config=CONFIG,
                            tokenizer="char:" + DEMO_ALPHABET, dataset="letter-sum", group_size=4, max_tokens=2,
                            spool_dir=str(tmp_path / "spool"))
        tokenizer = load_tokenizer(cfg.tokenizer)
        old = Policy(cfg, tokenizer)
        old.refresh()  # version 0: the initial weights
        with CuratorClient(server.url) as c:
            [req] = c.sampling_requests(1, producer_id="p1", dataset="letter-sum")
            group = build_group(old, req, cfg)
            c.post_group(group)
        factory = make_sessionmaker(get_engine(fresh_db))
        drain(factory, scorer, timeout_s=60)
        with CuratorClient(server.url) as c:
            g = c.get_group(group["id"], include_tokens=True)
        cut = [t["index"] for t in g["trajectories"] if t["finish_reason"] == "length"]
        assert cut, "max_tokens 2 cuts some member"
        assert g["status"] == "waiting"

        server.proc.send_signal(signal.SIGKILL)  # the API dies; the checkpoint is in PostgreSQL
        server.proc.wait(timeout=10)
        server = start_server(fresh_db)

        moved = build_model(TrainerConfig(model_config=CONFIG, seed=2))  # the policy moved: other weights
        new = Policy(cfg, tokenizer, version=1)
        new.sampler = HFSampler(moved, tokenizer.eos_token_id, tokenizer.pad_token_id or tokenizer.eos_token_id)
        with CuratorClient(server.url) as c:
            requests = [r for r in c.sampling_requests(10, producer_id="p2", dataset="letter-sum")
                        if r["reason"] == "resume"]
            assert sorted(r["index"] for r in requests) == cut
            for r in requests:
                stored = g["trajectories"][r["index"]]
                ckpt = r["checkpoint"]
                assert ckpt["token_ids"] == stored["token_ids"] and ckpt["loss_mask"] == stored["loss_mask"]
                assert ckpt["versions"] == [0 if m else -1 for m in stored["loss_mask"]]
                assert ckpt["logprobs"] == pytest.approx(stored["logprobs"])
            cfg.max_tokens = 4
            assert fill_slots(c, new, requests, cfg) == len(requests)
            resumed = c.get_group(group["id"], include_tokens=True)
        decisions = {(d["index"], d["rule"]) for d in resumed["decisions"]}
        assert {(i, "remedy_filled") for i in cut} <= decisions

        for i in cut:
            before, after = g["trajectories"][i], resumed["trajectories"][i]
            k = len(before["token_ids"])
            assert after["token_ids"][:k] == before["token_ids"] and len(after["token_ids"]) > k
            assert after["versions"][:k] == [0 if m else -1 for m in before["loss_mask"]]
            assert after["versions"][k:] == [1] * (len(after["token_ids"]) - k)  # the continuation: version 1

        # the trainer holds the moved weights: TIS per token from the stored behaviour log-probs
        t = resumed["trajectories"][cut[0]]
        batch = {"groups": [{"id": "x", "policy_version": 0, "temperature": 1.0, "trajectories": [
            {"index": 0, "token_ids": t["token_ids"], "loss_mask": t["loss_mask"], "logprobs": t["logprobs"],
             "versions": t["versions"], "advantage": 1.0}]}]}
        [mb] = pack_batch(batch, 4096)
        assert mb.mixed is not None and bool(mb.mixed.all())
        trainer_policy = PolicyLogprobs(moved)
        recomputed = frozen_logprobs(trainer_policy, mb)  # (S, Tm)
        w = tis_weights(recomputed, mb.old_logp, mb.loss_mask, cap=1e9)  # (S, Tm)
        trained = mb.loss_mask > 0
        old_part = trained & (mb.versions == 0)
        new_part = trained & (mb.versions == 1)
        assert bool(old_part.any()) and bool(new_part.any())
        assert bool(((w - 1).abs() > 1e-3)[old_part].all())  # the checkpoint's tokens are off-policy
        assert torch.allclose(w[new_part], torch.ones_like(w[new_part]), atol=1e-3)  # sampled by these weights
        # even when the trainer trusts the batch's log-probs, a resumed micro-batch is recomputed
        frozen = _freeze(trainer_policy, mb, StepConfig(old_from_batch=True), None)
        assert frozen.behaviour is not None
        torch.testing.assert_close(frozen.old, recomputed)
    finally:
        stop_server(server)


def test_continue_episode_runs_no_tool_of_the_checkpoint(tmp_path):
    """The checkpoint holds a tool's result; continuing never calls that tool again."""
    tokenizer = load_tokenizer("char:" + DEMO_ALPHABET)
    model = build_model(TrainerConfig(model_config=CONFIG, seed=3))
    sampler = HFSampler(model, tokenizer.eos_token_id, tokenizer.pad_token_id or tokenizer.eos_token_id)
    calls: list[str] = []

    def tool(args: str) -> str:
        calls.append(args)
        return "a"

    prompt = tokenizer.encode("ab=")
    obs = tokenizer.encode("a")
    checkpoint = {"messages": [{"role": "assistant", "content": "c", "tool_calls": []},
                               {"role": "tool", "content": "a", "tool_call_id": "call-0"}],
                  "token_ids": prompt + [5] + obs, "loss_mask": [0] * len(prompt) + [1] + [0] * len(obs),
                  "logprobs": [0.0] * len(prompt) + [-1.5] + [0.0] * len(obs),
                  "versions": [-1] * len(prompt) + [0] + [-1] * len(obs)}
    out = continue_episode(sampler, tokenizer, checkpoint, tools={"lookup": tool}, max_turns=1, max_tokens=3,
                           seed=0, version=4)
    assert calls == []
    k = len(checkpoint["token_ids"])
    assert out["token_ids"][:k] == checkpoint["token_ids"] and out["logprobs"][:k] == checkpoint["logprobs"]
    assert out["versions"][:k] == checkpoint["versions"] and set(out["versions"][k:]) == {4}
    assert out["messages"][:2] == checkpoint["messages"] and out["messages"][2]["role"] == "assistant"
    assert out["metadata"]["checkpoint"] == {"tokens": k, "messages": 2}  # the boundary before the new turn

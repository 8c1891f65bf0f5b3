"""Resume of a trajectory without behaviour log-probs, through real processes: the producer continues the
episode and posts no log-probs (no behaviour policy, the whole trajectory), the service takes that fill; a
fill the service refuses (4xx) is logged naming the group, the slot and the field, its request is marked
done (never offered again), and the producer goes on with the next request instead of dying."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select

from rollout.producer import Policy, RolloutConfig, build_group, fill_slots
from rollout.tasks import DEMO_ALPHABET, load_tokenizer
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from service.store.models import SamplingRequest
from service.worker.pipeline import drain
from tests.conftest import start_server, stop_server
from tests.rollout.test_resume import set_up_resume
from trainer.worker import tiny_model_config

CONFIG = tiny_model_config(vocab_size=3 + len(DEMO_ALPHABET))


def _cut_group_without_logprobs(url: str, db_url: str, tmp_path: Any, scorer: Any) -> tuple[Policy, RolloutConfig,
                                                                                           str, list[dict]]:
    """A group posted with null log-probs, cut by max_tokens 2: (policy, config, group id, resume requests)."""
    set_up_resume(url)
    cfg = RolloutConfig(service_url=url, producer_id="p1", run_id="r", seed=1, model_config=CONFIG,
                        tokenizer="char:" + DEMO_ALPHABET, dataset="letter-sum", group_size=4, max_tokens=2,
                        spool_dir=str(tmp_path / "spool"))
    policy = Policy(cfg, load_tokenizer(cfg.tokenizer))
    policy.refresh()
    with CuratorClient(url) as c:
        [req] = c.sampling_requests(1, producer_id="p1", dataset="letter-sum")
        group = build_group(policy, req, cfg)
        for t in group["trajectories"]:
            t["logprobs"] = None  # a producer that sends no log-probs: ingest takes it
        c.post_group(group)
    drain(make_sessionmaker(get_engine(db_url)), scorer, timeout_s=60)
    with CuratorClient(url) as c:
        assert c.get_group(group["id"])["status"] == "waiting"
        reqs = [r for r in c.sampling_requests(20, producer_id="p2", dataset="letter-sum") if r["reason"] == "resume"]
    assert reqs and all(r["checkpoint"]["logprobs"] is None for r in reqs)
    return policy, cfg, group["id"], reqs


def test_a_trajectory_without_logprobs_is_resumed_without_any_and_a_refused_fill_is_logged_and_released(
        fresh_db, tmp_path, scorer, caplog):
    """One cut group's resume requests (one server, one posted group): the first is filled with made-up
    log-probs for its checkpoint's tokens and refused; the producer goes on and fills the others, each
    resumed without log-probs."""
    server = start_server(fresh_db)
    try:
        policy, cfg, gid, reqs = _cut_group_without_logprobs(server.url, fresh_db, tmp_path, scorer)
        assert len(reqs) >= 2
        cfg.max_tokens = 4
        bad, good = reqs[0], reqs[1:]
        n = len(bad["checkpoint"]["token_ids"])  # made-up log-probs for the checkpoint's tokens: refused (422)
        bad = {**bad, "checkpoint": {**bad["checkpoint"], "logprobs": [0.0] * n}}
        with caplog.at_level(logging.ERROR, logger="rollout.producer"), CuratorClient(server.url) as c:
            assert fill_slots(c, policy, [bad, *good], cfg) == len(good)  # the requests after it are served
            g = c.get_group(gid, include_tokens=True)
            again = c.sampling_requests(20, producer_id="p3", dataset="letter-sum")

        # the refused fill: logged naming the group, the slot and the field; its request released
        [record] = [r for r in caplog.records if "refused" in r.getMessage()]
        text = record.getMessage()
        assert gid in text and f"slot {bad['index']}" in text and "trajectory.logprobs" in text and "422" in text
        with make_sessionmaker(get_engine(fresh_db))() as s:
            row = s.scalars(select(SamplingRequest).where(SamplingRequest.pk == bad["request_id"])).one()
        assert row.status == "done" and row.filled_at is None  # released: never offered again
        assert bad["request_id"] not in {r["request_id"] for r in again}
        assert g["status"] == "waiting"  # the refused slot waits for its deadline, then trains without it

        # the fills taken: resumed without log-probs
        for r in good:
            t = g["trajectories"][r["index"]]
            k = len(r["checkpoint"]["token_ids"])
            assert t["logprobs"] is None, "no behaviour policy for the whole trajectory, never half"
            assert t["token_ids"][:k] == r["checkpoint"]["token_ids"] and len(t["token_ids"]) > k, "continued"
            assert set(t["versions"][k:]) == {policy.version}
        assert {(r["index"], "remedy_filled") for r in good} <= {(d["index"], d["rule"]) for d in g["decisions"]}
        assert bad["index"] not in {d["index"] for d in g["decisions"] if d["rule"] == "remedy_filled"}
    finally:
        stop_server(server)

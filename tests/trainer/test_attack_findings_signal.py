"""Attack findings on the training-signal work (issue 12): each test fails on the branch as reviewed.

Real parts only: the FastAPI app over a real PostgreSQL (TestClient), the real curation, packing, fused
log-prob head, loss and train step on a tiny random Qwen2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine

from filters import CurationPolicy, GroupScore, TrajectoryScore, ZeroVariance, curate_group, curate_groups
from rollout.episodes import _Episode
from rollout.sampler import Completion
from service.app import create_app
from service.ingest.schemas import TrajectoryIn
from tests.helpers import make_group
from tests.service.delivery.helpers import mark_ready, reset
from tests.trainer.batches import VOCAB, tiny_model
from trainer.loss import LossConfig, policy_loss
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step

# -- service fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def attack_url(make_db) -> str:
    return make_db()


@pytest.fixture
def db(attack_url: str) -> Iterator[Engine]:
    engine = create_engine(attack_url)
    reset(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def api(attack_url: str, db: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(database_url=attack_url)) as c:
        yield c


def _trainable_group(gid: str, temperature: object) -> dict:
    """A group whose token ids fit the tiny model's vocabulary, with the given sampling.temperature."""
    group = make_group(gid, n=4)
    for i, t in enumerate(group["trajectories"]):
        t["token_ids"] = [1 + (7 * i + 3 * k) % (VOCAB - 1) for k in range(len(t["token_ids"]))]
    group["sampling"] = {"temperature": temperature, "max_tokens": 16}
    return group


# -- 1. a tiny temperature passes ingest and then breaks the trainer ----------------------------------


@pytest.mark.parametrize("temperature", [1e-40, 1e-300])
def test_a_temperature_accepted_at_ingest_trains_to_finite_weights(api, db, temperature):
    """Ingest accepts any finite temperature > 0. The trainer turns it into fp32 per-position temperatures:
    1e-300 underflows to 0 (token_logprobs raises: the leased batch can never be trained, a poison batch
    that comes back after every lease expiry); 1e-40 is an fp32 subnormal whose inverse is inf, so the
    log-probs are NaN and one optimizer step writes NaN into every weight. Either ingest must refuse
    such a temperature (422) or the trainer must train the batch to finite weights."""
    r = api.post("/v1/groups", json=_trainable_group("tiny-temp", temperature))
    if r.status_code == 422:
        return  # refused at ingest: fixed
    assert r.status_code == 201, r.text
    mark_ready(db)
    lease = api.post("/v1/batches/lease", json={"trainer_id": "t0", "max_groups": 10})
    assert lease.status_code == 200, lease.text
    batch = lease.json()
    assert batch["groups"][0]["temperature"] == temperature

    model = tiny_model()
    policy = PolicyLogprobs(model, chunk_tokens=64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = train_step(policy, opt, pack_batch(batch, 4096), StepConfig(autocast=False))
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters()), (
        "NaN / inf written into the weights"
    )


# -- 2. a huge integer temperature passes the new validator and crashes ingest ------------------------


def test_a_huge_integer_temperature_is_refused_not_a_server_error(attack_url, db):
    """sampling.temperature = 10**400 (a JSON integer) passes the new `0 < temp < inf` check (a Python
    int compares fine with inf); storing it then fails in orjson ("Integer exceeds 64-bit range") and
    the request ends in 500 Internal Server Error. Were it stored, the lease query's ::float8 cast would
    refuse it too. A hostile or buggy producer must get a 422 naming sampling.temperature."""
    bad = _trainable_group("huge-temp", 1)
    body = json.dumps(bad).replace('"temperature": 1,', '"temperature": 1' + "0" * 400 + ",")
    with TestClient(create_app(database_url=attack_url), raise_server_exceptions=False) as api:
        r = api.post("/v1/groups", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "temperature" in r.text, (r.status_code, r.text[:300])


# -- 3. GSPO with its defaults is not GSPO's objective ------------------------------------------------


def test_sequence_ratio_with_default_config_is_the_gspo_objective():
    """GSPO (Zheng et al. 2025, eq. 5): J = 1/G sum_i min(s_i A_i, clip(s_i, 1-eps_l, 1+eps_h) A_i) with
    s_i = exp(mean_t(log pi - log pi_old)) -- every sequence weighs the same. `ratio_level="sequence"`
    gets GSPO's clip ranges by default but keeps agg="token-mean", which weighs each sequence by its
    length (the loss module says the gradient "equals sequence-level GSPO under any of the
    aggregations"). Reference: GSPO written out in float64, gradients compared."""
    torch.manual_seed(0)
    lengths = [2, 6, 4]
    b, t = len(lengths), max(lengths)
    mask = torch.zeros(b, t, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logp0 = torch.randn(b, t, dtype=torch.float64) * 0.3 - 1.0
    old = logp0 + torch.randn(b, t, dtype=torch.float64) * 1e-4  # inside and outside the 3e-4 clip
    adv = torch.tensor([1.0, -0.5, 0.7], dtype=torch.float64)

    cfg = LossConfig(ratio_level="sequence", tis_cap=None)
    low, high = cfg.clip
    assert (low, high) == (3e-4, 4e-4)
    lp = logp0.clone().requires_grad_()
    loss, _ = policy_loss(lp, old, adv, mask, cfg)
    loss.backward()

    ref_lp = logp0.clone().requires_grad_()
    terms = []
    for i, n in enumerate(lengths):
        s = torch.exp((ref_lp[i, :n] - old[i, :n]).mean())
        terms.append(-torch.minimum(s * adv[i], s.clamp(1 - low, 1 + high) * adv[i]))
    ref = torch.stack(terms).mean()
    ref.backward()

    assert float(loss) == pytest.approx(float(ref), rel=1e-9)
    torch.testing.assert_close(lp.grad, ref_lp.grad, rtol=1e-9, atol=1e-12)


# -- 4. soft_overlong judges a multi-turn episode's total by a per-turn budget ------------------------


def _two_turn_episode(turn_tokens: int) -> dict:
    """What rollout.episodes.multi_turn builds for: turn 1 calls a tool (stop), the tool answers, turn 2
    answers (stop); each turn sampled with the per-turn budget."""
    ep = _Episode([1, 5, 6])
    first = Completion([10] * (turn_tokens - 1) + [2], [-0.1] * turn_tokens, "stop")
    ep.model_turn(first, "<call>calc(1+1)</call>", None, 0)
    ep.observation([7, 7], "2", 0)
    second = Completion([11] * (turn_tokens - 1) + [2], [-0.1] * turn_tokens, "stop")
    ep.model_turn(second, "b", None, 1)
    return ep.done("stop")


def test_soft_overlong_does_not_punish_a_multi_turn_episode_whose_turns_all_fit():
    """The producer samples every turn of a multi-turn episode with `max_tokens` and posts that per-turn
    budget as the group's sampling.max_tokens; the service's num_tokens is the episode's loss-mask sum
    over all turns. With soft_overlong, an episode of two 10-token turns under a 16-token per-turn budget
    (no turn came near its budget) counts as 20 > 16 tokens and gets the full -1, the same as a response
    cut off by the budget -- so the shaping teaches the policy to stop calling tools."""
    budget, turn = 16, 10
    episodes = [_two_turn_episode(turn), _two_turn_episode(turn)]
    trajs = [
        TrajectoryScore(i, "stop", float(i), {}, float(i), TrajectoryIn(**e).response_tokens())
        for i, e in enumerate(episodes)
    ]
    assert [t.num_tokens for t in trajs] == [2 * turn, 2 * turn]
    group = GroupScore("mt", 0, trajs, max_tokens=budget)
    policy = CurationPolicy(zero_variance=ZeroVariance(action="keep"), min_group_size=1, soft_overlong=True)
    for decision in (curate_group(group, policy, None), curate_groups([group], policy, None)[0]):
        used = [d.reward_used for d in decision.trajectories]
        assert used == [t.total for t in trajs], f"every turn fit its budget, yet reward_used = {used}"


# -- 5. the new default max_staleness strands stale groups in 'ready', and the producer waits on them ---


def test_groups_the_default_staleness_never_leases_do_not_stall_the_producer(live_server, tmp_path):
    """TrainerConfig.max_staleness now defaults to 2 x save_every when checkpoints are written. The service
    applies it only as a lease filter: groups older than that stay 'ready' for ever -- no trainer with
    the default will take them, nothing drops them -- and the producer's back-pressure (`backlog`, used
    with `max_backlog`) counts 'ready' groups, so once `max_backlog` of them pile up the producer pauses
    for good and the trainer gets 204s for good: a deadlock. Real uvicorn server, real client, the
    trainer's and the producer's own functions."""
    from rollout.producer import backlog
    from service.client import CuratorClient
    from tests.service.delivery.helpers import seed_ready
    from trainer.parallel import DistContext
    from trainer.worker import TrainerConfig
    from trainer.worker import lease as trainer_lease

    cfg = TrainerConfig(
        model_config={"model_type": "qwen2"},
        checkpoint_dir=str(tmp_path / "ckpt"),
        save_every=10,
        wait_seconds=0.0,
        max_groups=8,
    )
    assert cfg.max_staleness == 20  # "auto"
    engine = create_engine(live_server.db_url)
    try:
        with CuratorClient(live_server.url) as client:
            seed_ready(client._http, engine, 4, prefix="old", policy_version=3)
            client.publish_policy(30, {})  # the trainer moved on (say the producer was down for a while)
            ctx = DistContext(rank=0, world_size=1, device=torch.device("cpu"))
            assert trainer_lease(client, cfg, ctx) is None  # too stale for the default: right
            # ... but a producer with max_backlog=4 now waits for ever on groups nobody will lease
            assert backlog(client) == 0, (
                "stale groups no trainer will lease still count as the producer's backlog"
            )
    finally:
        engine.dispose()

"""Guards added after the training-signal attack (issue 12): non-finite steps, temperatures out of range,
pi_old in eval mode, soft_overlong on multi-turn members. Real tiny Qwen2, real packing / loss / step."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine

from filters import CurationPolicy, GroupScore, TrajectoryScore, ZeroVariance, curate_group, curate_groups
from filters.rules import overlong_penalties
from service.app import create_app
from service.ingest.schemas import TEMPERATURE_MAX, TEMPERATURE_MIN, GroupIn
from tests.helpers import make_group
from tests.service.delivery.helpers import mark_ready, reset
from tests.trainer.batches import VOCAB, make_batch, tiny_config, tiny_model
from trainer.delivery import unusable
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs, frozen_logprobs
from trainer.step import StepConfig, train_step
from trainer.worker import build_model


def _with_temperature(temp: float) -> dict:
    batch = make_batch(n_groups=2, group_size=3, seed=3)
    for g in batch["groups"]:
        g["temperature"] = temp
    return batch


@pytest.mark.parametrize("temp", [1e-40, 1e-300])
def test_a_non_finite_step_is_skipped_and_leaves_the_weights_untouched(temp):
    """A batch stored before ingest checked temperatures (or any batch whose loss / grad norm is not
    finite): the step is skipped, reported as nonfinite, and not one weight changes."""
    model = tiny_model()
    policy = PolicyLogprobs(model, chunk_tokens=64)
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    try:
        metrics = train_step(policy, opt, pack_batch(_with_temperature(temp), 4096), StepConfig(autocast=False))
    except ValueError as exc:  # 1e-300 rounds to an fp32 0: refused before any forward
        assert "temperature" in str(exc)
        metrics = {"skipped": 1.0, "nonfinite": 1.0}
    assert metrics["skipped"] == 1.0 and metrics["nonfinite"] == 1.0
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in model.parameters())


def test_a_finite_step_still_steps():
    model = tiny_model()
    policy = PolicyLogprobs(model, chunk_tokens=64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = train_step(policy, opt, pack_batch(_with_temperature(0.7), 4096), StepConfig(autocast=False))
    assert metrics["skipped"] == 0.0 and "nonfinite" not in metrics


@pytest.mark.parametrize("temp", [1e-40, TEMPERATURE_MIN / 2, TEMPERATURE_MAX * 2])
def test_the_trainer_refuses_a_batch_whose_temperature_is_out_of_range(temp):
    reason = unusable(_with_temperature(temp), need_logprobs=False)
    assert reason is not None and "temperature" in reason
    assert unusable(_with_temperature(TEMPERATURE_MIN), need_logprobs=False) is None


@pytest.mark.parametrize(
    "temp", [0, -1, 1e-5, 1e-40, 10**5, 10**400, 1e300, True, "1", float("nan"), float("inf")]
)
def test_ingest_refuses_temperatures_outside_the_documented_range(temp):
    group = make_group("g", n=2)
    group["sampling"] = {"temperature": temp}
    with pytest.raises(ValueError, match="sampling.temperature"):
        GroupIn(**group)
    group["sampling"] = {"temperature": TEMPERATURE_MIN}
    GroupIn(**group)
    group["sampling"] = {"temperature": int(TEMPERATURE_MAX)}
    GroupIn(**group)


def test_pi_old_is_computed_without_dropout_and_the_mode_is_restored():
    model = build_model(tiny_config(model_config={**tiny_config().model_config, "attention_dropout": 0.5}))
    policy = PolicyLogprobs(model, chunk_tokens=64)
    [mb] = pack_batch(make_batch(seed=1), 4096)
    policy.train()
    a, b = frozen_logprobs(policy, mb), frozen_logprobs(policy, mb)
    assert policy.training and model.training
    mask = mb.loss_mask > 0
    torch.testing.assert_close(a[mask], b[mask], rtol=0, atol=0)
    policy.eval()
    torch.testing.assert_close(frozen_logprobs(policy, mb)[mask], a[mask], rtol=0, atol=0)
    assert not policy.training


@pytest.mark.parametrize("turns", [1, 2, 3])
@pytest.mark.parametrize("num_tokens", [1, 12, 14, 16, 17, 40])
def test_soft_overlong_shapes_single_turn_members_only(turns, num_tokens):
    """max_tokens is a per-turn budget: a multi-turn member is never shaped by soft_overlong, whatever its
    total; a single-turn member within the budget gets the ramp; reference == vectorised == scalar rule."""
    budget = 16
    policy = CurationPolicy(zero_variance=ZeroVariance(action="keep"), min_group_size=1, soft_overlong=True)
    trajs = [TrajectoryScore(i, "stop", float(i), {}, float(i), num_tokens, num_turns=turns) for i in range(2)]
    group = GroupScore("g", 0, trajs, max_tokens=budget)
    ref = [d.reward_used for d in curate_group(group, policy, None).trajectories]
    vec = [d.reward_used for d in curate_groups([group], policy, None)[0].trajectories]
    assert ref == vec
    pen = overlong_penalties(np.array([num_tokens]), np.array([budget]), np.array([False]), policy, np.array([turns]))
    if turns > 1 or num_tokens > budget:
        assert ref == [0.0, 1.0] and pen[0] == 0.0
    else:
        expected = 0.0 if num_tokens <= budget - 3 else (budget - 3 - num_tokens) / 3  # buffer 0.2 x 16 -> 3
        assert pen[0] == pytest.approx(expected)
        assert ref == pytest.approx([expected, 1.0 + expected])


# -- service fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def signal_url(make_db) -> str:
    return make_db()


@pytest.fixture
def db(signal_url: str) -> Iterator[Engine]:
    engine = create_engine(signal_url)
    reset(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def api(signal_url: str, db: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(database_url=signal_url)) as c:
        yield c


def _trainable_group(gid: str, temperature: object) -> dict:
    """A group whose token ids fit the tiny model's vocabulary, with the given sampling.temperature."""
    group = make_group(gid, n=4)
    for i, t in enumerate(group["trajectories"]):
        t["token_ids"] = [1 + (7 * i + 3 * k) % (VOCAB - 1) for k in range(len(t["token_ids"]))]
    group["sampling"] = {"temperature": temperature, "max_tokens": 16}
    return group


# -- 1. a tiny temperature passes ingest and then breaks the trainer ----------------------------------
# Attack: a tiny temperature ingest accepted became 0 / inf in fp32: a poison batch, or non-finite weights.


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
# Attack: sampling.temperature = 10**400 (a JSON integer) passed the finite check and crashed -> 500.


def test_a_huge_integer_temperature_is_refused_not_a_server_error(signal_url, db):
    """sampling.temperature = 10**400 (a JSON integer) passes the new `0 < temp < inf` check (a Python
    int compares fine with inf); storing it then fails in orjson ("Integer exceeds 64-bit range") and
    the request ends in 500 Internal Server Error. Were it stored, the lease query's ::float8 cast would
    refuse it too. A hostile or buggy producer must get a 422 naming sampling.temperature."""
    bad = _trainable_group("huge-temp", 1)
    body = json.dumps(bad).replace('"temperature": 1,', '"temperature": 1' + "0" * 400 + ",")
    with TestClient(create_app(database_url=signal_url), raise_server_exceptions=False) as api:
        r = api.post("/v1/groups", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "temperature" in r.text, (r.status_code, r.text[:300])

"""A trainer's out-of-vocabulary refusal, verified: ``nack(drop=True, vocab_size=V)`` drops a group only
when the service finds a stored token id >= V itself; a group within the vocabulary goes back to the queue
whatever the trainer claims, and a bad vocab_size is a 422 that changes nothing."""

from __future__ import annotations

from reward_models.scoring import Scorer
from service.worker.pipeline import drain
from tests.helpers import make_group, make_trajectory


def _two_ready(api) -> dict:
    oov = make_group("oov-1", prompt_id="vp1", answers=["42", "41"])
    oov["trajectories"][1] = make_trajectory(answer="41", seed=1, token_ids=[5, 6, 7, 900, 8, 9, 10, 11, 12, 13])
    for g in (oov, make_group("fits-1", prompt_id="vp2", answers=["42", "41"])):
        assert api.post("/v1/groups", json=g).status_code in (200, 201)
    with Scorer(processes=1, timeout_s=20) as scorer:
        assert drain(api.factory, scorer).ready == 2
    batch = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 4}).json()
    assert len(batch["groups"]) == 2
    return batch


def test_nack_with_vocab_size_drops_only_the_group_with_a_token_beyond_it(fresh_api):
    batch = _two_ready(fresh_api)
    r = fresh_api.post(f"/v1/batches/{batch['batch_id']}/nack",
                       json={"reason": "token id 900 outside vocab", "drop": True, "vocab_size": 512})
    assert r.status_code == 200, r.text
    bad, fits = fresh_api.get("/v1/groups/oov-1").json(), fresh_api.get("/v1/groups/fits-1").json()
    assert (bad["status"], bad["drop_reason"]) == ("dropped", "untrainable")
    assert fits["status"] == "ready"


def test_a_vocab_size_above_every_token_keeps_the_groups(fresh_api):
    batch = _two_ready(fresh_api)
    r = fresh_api.post(f"/v1/batches/{batch['batch_id']}/nack", json={"drop": True, "vocab_size": 901})
    assert r.status_code == 200, r.text
    assert {fresh_api.get(f"/v1/groups/{g}").json()["status"] for g in ("oov-1", "fits-1")} == {"ready"}


def test_a_bad_vocab_size_is_refused_naming_the_field(fresh_api):
    batch = _two_ready(fresh_api)
    for bad in (0, -3, "512", 2**40):
        r = fresh_api.post(f"/v1/batches/{batch['batch_id']}/nack", json={"drop": True, "vocab_size": bad})
        assert r.status_code == 422 and "vocab_size" in r.text, (bad, r.text)
    assert fresh_api.get(f"/v1/batches/{batch['batch_id']}").json()["status"] == "active"

"""The rollouts export of groups whose prompt is stored once (service.store.prefix): every member's token ids,
loss mask and log-probs come out exactly as posted, in Parquet and in JSONL."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
from sqlalchemy import text

from reward_models.scoring import Scorer
from service.export import repository as export_repo
from service.store import arrays
from service.worker.pipeline import drain
from tests.helpers import make_group, make_shared_prompt_group

SPEC = {"name": "dedup", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}
DTYPES = {"token_ids": arrays.TOKEN_DTYPE, "loss_mask": arrays.MASK_DTYPE, "logprobs": arrays.LOGPROB_DTYPE}


def posted_groups() -> list[dict]:
    shared = make_shared_prompt_group("x-shared", prompt_id="p-1", answers=["42", "41", "42", "7"])
    differ = make_shared_prompt_group("x-differ", prompt_id="p-2", seed=1, answers=["42", "1", "2", "3"])
    differ["trajectories"][2]["token_ids"][20] += 1  # the stored prefix stops at token 20
    signed = make_shared_prompt_group("x-signed", prompt_id="p-3", seed=2, answers=["42", "1", "42", "3"])
    signed["trajectories"][3]["logprobs"][30] = -0.0  # not the others' 0.0: the prefix stops at token 30
    plain = make_group("x-plain", prompt_id="p-4", answers=["42", "5"])  # no shared prompt: stored whole
    return [shared, differ, signed, plain]


def test_the_rollouts_export_carries_the_posted_arrays_exactly(fresh_api):
    api = fresh_api
    assert api.post("/v1/reward-specs", json=SPEC).status_code == 201
    assert api.put("/v1/datasets/toy", json={"reward_spec": "dedup"}).status_code == 200
    posted = posted_groups()
    assert api.post("/v1/groups", json={"groups": posted}).status_code == 201
    with Scorer(processes=1, timeout_s=20) as scorer:
        drain(api.factory, scorer, timeout_s=120)
    want = {(g["id"], i): {name: arrays.encode(t.get(name), dtype) for name, dtype in DTYPES.items()}
            for g in posted for i, t in enumerate(g["trajectories"])}

    r = api.get("/v1/export", params={"format": "rollouts", "filetype": "parquet"})
    assert r.status_code == 200, r.text
    got = {(x["group_id"], x["index"]): {name: None if x[name] is None else np.asarray(x[name], dtype).tobytes()
                                         for name, dtype in DTYPES.items()}
           for x in pq.read_table(io.BytesIO(r.content)).to_pylist()}
    assert got == want

    r = api.get("/v1/export", params={"format": "rollouts", "filetype": "jsonl"})
    assert r.status_code == 200, r.text
    rows = [json.loads(line) for line in r.content.splitlines()]
    got = {(x["group_id"], x["index"]): {name: arrays.encode(x[name], dtype) for name, dtype in DTYPES.items()}
           for x in rows}
    assert got == want


def test_the_export_page_size_counts_the_whole_arrays(fresh_api):
    """The export pages by about how many bytes a group reads: a member's whole arrays (its stored rest and
    the group's prefix), not only what its row stores."""
    posted = make_shared_prompt_group("s-1", prompt_id="p-1", prompt_len=400)
    assert fresh_api.post("/v1/groups", json={"groups": [posted]}).status_code == 201
    with fresh_api.factory() as session:
        [pk] = session.execute(text("SELECT pk FROM groups")).scalars()
        assert session.execute(text("SELECT max(prefix_len) FROM trajectories")).scalar_one() == 400
        size = export_repo.group_bytes(session, [pk])[pk]
    whole = sum(len(arrays.encode(t[name], dtype)) for t in posted["trajectories"] for name, dtype in DTYPES.items())
    assert size >= whole  # the arrays' whole bytes, and the messages' and metadata's JSON besides

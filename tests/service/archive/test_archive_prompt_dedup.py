"""Archiving groups whose prompt is stored once (service.store.prefix): the Parquet rows carry every member's
whole arrays -- token ids, loss mask, log-probs, versions -- exactly as posted, and so does the export that
reads them back."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl
from sqlalchemy import text

from reward_models.scoring import Scorer
from service.archive import service as archive
from service.store import arrays
from service.store.db import get_engine
from service.worker.pipeline import drain
from tests.helpers import make_group, make_shared_prompt_group
from tests.service.archive.test_archive import leave_the_window

SPEC = {"name": "arc", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}
DTYPES = {"token_ids": arrays.TOKEN_DTYPE, "loss_mask": arrays.MASK_DTYPE, "logprobs": arrays.LOGPROB_DTYPE,
          "versions": arrays.VERSION_DTYPE}


def posted_groups() -> list[dict]:
    shared = make_shared_prompt_group("d-shared", prompt_id="p-1", answers=["42", "41", "42", "7"])
    zero = make_shared_prompt_group("d-zero", prompt_id="p-2", seed=1)  # all right: dropped, final too
    differ = make_shared_prompt_group("d-differ", prompt_id="p-3", seed=2, answers=["42", "1", "2", "3"])
    differ["trajectories"][1]["logprobs"][17] += 0.25  # the stored prefix stops at token 17
    plain = make_group("d-plain", prompt_id="p-4", answers=["42", "5"])  # no shared prompt: stored whole
    return [shared, zero, differ, plain]


def _bytes(values, dtype) -> bytes | None:
    return None if values is None else np.asarray(values, dtype).tobytes()


def test_archived_rows_carry_the_whole_arrays(fresh_api, fresh_db: str, tmp_path: Path) -> None:
    api, engine = fresh_api, get_engine(fresh_db)
    assert api.post("/v1/reward-specs", json=SPEC).status_code == 201
    assert api.put("/v1/datasets/toy", json={"reward_spec": "arc"}).status_code == 200
    posted = posted_groups()
    assert api.post("/v1/groups", json={"groups": posted}).status_code == 201
    with engine.connect() as conn:  # three groups stored their prompt once
        assert conn.execute(text("SELECT count(*) FROM prompt_prefixes")).scalar_one() == 3
    with Scorer(processes=1, timeout_s=20) as scorer:
        drain(api.factory, scorer, timeout_s=120)
    r = api.post("/v1/batches/lease", json={"trainer_id": "t", "max_groups": 10})
    assert r.status_code == 200, r.text
    assert api.post(f"/v1/batches/{r.json()['batch_id']}/ack").status_code == 200
    leave_the_window(api)
    want = {(g["id"], i): {name: arrays.encode(t.get(name), dtype) for name, dtype in DTYPES.items()}
            for g in posted for i, t in enumerate(g["trajectories"])}

    result = archive.archive(engine, str(tmp_path), timedelta(0))
    assert result.groups == len(posted) and result.trajectories == len(want)
    df = pl.read_parquet(tmp_path / "all", hive_partitioning=True)
    got = {(x["group_id"], x["index"]): {name: _bytes(x[name], dtype) for name, dtype in DTYPES.items()}
           for x in df.iter_rows(named=True)}
    assert got == want

    r = api.get("/v1/export", params={"format": "rollouts", "include_archived": "true",
                                      "status": list(archive.FINAL_STATUSES)})
    assert r.status_code == 200, r.text
    rows = [json.loads(line) for line in r.text.splitlines()]
    names = ("token_ids", "loss_mask", "logprobs")  # what the rollouts format carries
    assert {(x["group_id"], x["index"]): {n: _bytes(x[n], DTYPES[n]) for n in names} for x in rows} == {
        k: {n: v[n] for n in names} for k, v in want.items()}

"""The short crash suite (bench/chaos.py): real API, worker, producer and consumer processes on a private
PostgreSQL, SIGKILLed and restarted (PostgreSQL included); nothing acknowledged is lost or doubled."""

from __future__ import annotations

import shutil

import pytest

from bench import chaos


@pytest.mark.skipif(shutil.which("initdb") is None or shutil.which("pg_ctl") is None,
                    reason="needs PostgreSQL's initdb / pg_ctl for a private cluster")
def test_short_kill_suite_loses_nothing():
    r = chaos.run(cycles=5, interval=0.8, pg_every=2, drain_s=40, seed=1, keep=False)
    assert r["killed"].get("postgres") == 2
    assert r["acknowledged"] > 0 and r["consumed"] > 0
    assert (r["lost"], r["duplicated"], r["stuck"], r["consumed_twice"]) == (0, 0, 0, 0), r
    assert r["poison_batches_reaching_consumers"] == 0
    assert all(not k.endswith("(None)") for k in r["poison"]), r["poison"]  # every poison group ended

"""A served process (``grpo-curator serve``'s app, ``served=True``) settles before its first request: pyarrow's
first array is built (it imports pandas, ~1 s of CPU, which each API process's first Arrow lease paid) and the
start-up objects are frozen out of the garbage collector's reach. An app built inside another program leaves
that program's collector alone. A warm-up that fails is logged and the process serves anyway (an attack found
the failure went to stderr unlogged and the freeze was skipped). Each case runs in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROBE = """
import gc, json, logging, sys
from fastapi.testclient import TestClient
from service.app import create_app
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage(), record.exc_info is not None))
logging.getLogger("service.app").addHandler(Keep())
app = create_app(database_url=sys.argv[1], served=sys.argv[2] == "served")
before = {"pandas": "pandas" in sys.modules, "frozen": gc.get_freeze_count()}
with TestClient(app) as client:  # the lifespan has run when this returns, before any request
    after = {"pandas": "pandas" in sys.modules, "frozen": gc.get_freeze_count()}
    status = client.get("/healthz").status_code
print(json.dumps({"before": before, "after": after, "healthz": status, "logged": records}))
"""


def _probe(db_url: str, mode: str, pythonpath: str | None = None) -> dict:
    env = {**os.environ, "GRPO_CURATOR_EMBEDDED_WORKER": "false"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, str(ROOT)])
    done = subprocess.run([sys.executable, "-c", PROBE, db_url, mode], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_served_app_imports_arrows_pandas_and_freezes_before_its_first_request(fresh_db):
    pytest.importorskip("pandas")
    got = _probe(fresh_db, "served")
    assert got["before"] == {"pandas": False, "frozen": 0}  # nothing done before it starts
    assert got["after"]["pandas"] is True and got["after"]["frozen"] > 10_000
    assert got["healthz"] == 200 and got["logged"] == []


def test_an_app_inside_another_program_leaves_its_collector_alone(fresh_db):
    got = _probe(fresh_db, "embedded")
    assert got["after"] == {"pandas": False, "frozen": 0} and got["healthz"] == 200


def test_a_failed_warm_up_is_logged_and_the_process_serves_frozen_anyway(fresh_db, tmp_path: Path):
    broken = tmp_path / "pandas"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise ValueError("numpy.dtype size changed, may indicate binary '
                                        'incompatibility")\n')
    got = _probe(fresh_db, "served", pythonpath=str(tmp_path))
    assert got["healthz"] == 200 and got["after"]["frozen"] > 10_000
    assert [(level, exc) for level, _, exc in got["logged"]] == [("WARNING", True)]
    assert "Arrow warm-up failed" in got["logged"][0][1]

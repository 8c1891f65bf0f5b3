"""The real OpenRLHF 0.11 (``make install-dev`` installs 0.11.2 --no-deps into its own folder, since 0.8.11
is the one in the venv): its own reward client (``SingleTurnAgentExecutor``: the HTTP POST with its retries,
or the reward-function file through its own loader), its own conversion of the answer into an
``Experience`` and its own concatenation of those, run in a subprocess with that folder first on sys.path
(tests/integrations/openrlhf_011_driver.py), against the live service. Each test asserts what
docs/integrations.md says OpenRLHF 0.11 does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.auth import keys
from service.store.db import get_engine, make_sessionmaker
from tests.conftest import LiveServer, start_server, stop_server
from tests.integrations.conftest import SPEC

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / ".venv" / "upstream" / "openrlhf-0.11.2"
DRIVER = Path(__file__).with_name("openrlhf_011_driver.py")
REWARD_FILE = ROOT / "grpo_curator_integrations" / "openrlhf.py"
GOOD = "<answer>42</answer></s>"

pytest.importorskip("torch", reason="OpenRLHF's reward path builds torch tensors (make install-dev installs torch)")
pytest.importorskip("aiohttp", reason="OpenRLHF 0.11 posts with aiohttp (the upstream extra of make install-dev)")
if not (UPSTREAM / "openrlhf" / "utils" / "agent.py").exists():
    pytest.skip(f"OpenRLHF 0.11.2 is not in {UPSTREAM} (make install-dev installs it)", allow_module_level=True)


def openrlhf_011(endpoint: str, cases: list[tuple[str, object]], **env: str) -> dict:
    """OpenRLHF 0.11 generates each (response, label) case and fetches its reward from ``endpoint`` (a URL,
    or a reward-function file); the driver's JSON answer."""
    run = subprocess.run([sys.executable, str(DRIVER), endpoint,
                          json.dumps([{"response": r, "label": lab} for r, lab in cases])],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "OPENRLHF_011_PATH": str(UPSTREAM), **env})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def value_mode(make_db) -> Iterator[tuple[LiveServer, str]]:
    """The service set up as docs/integrations.md says for OpenRLHF's URL (value mode), keys on."""
    db = make_db()
    with make_sessionmaker(get_engine(db)).begin() as s:
        admin, trainer = keys.create_key(s, "ops", "admin"), keys.create_key(s, "rl", "trainer")
    server = start_server(db, env={"GRPO_CURATOR_OPENRLHF_ON_ERROR": "value"})
    try:
        assert httpx.post(f"{server.url}/v1/reward-specs", json=SPEC,
                          headers={"authorization": f"Bearer {admin}"}).status_code == 201
        yield server, trainer
    finally:
        stop_server(server)


def test_default_mode_lists_are_converted_and_an_error_leaves_no_reward(service: LiveServer) -> None:
    """The service's defaults (``lists``, ``fail``): 0.11 turns the JSON lists into tensors; a 503 is retried
    five times, swallowed, and the sample has no reward, so joining the samples fails (no 0 is trained on)."""
    got = openrlhf_011(f"{service.url}/compat/openrlhf/integ/get_reward", [(GOOD, "42"), (GOOD, None)])
    ok, failed = got["cases"]
    assert ok["reward"] == [1.5] and ok["rewards"] == [[1.5]]
    assert ok["info"]["fmt"] == [[1.0]] and ok["info"]["correct"] == [[1.0]] and ok["info"]["reward_error"] == [[0.0]]
    assert failed["reward"] is None and failed["rewards"] is None and "reward" not in failed["info"]
    retries = [line for line in got["log"] if line.startswith("Request error, please check: 503")]
    assert len(retries) == 5
    assert got["log"][-1].startswith("[SingleTurnExecutor] Failed to fetch reward from remote RM: Request error for 5")
    assert not any("could not be scored" in line for line in got["log"])  # the reason is only in our 503 body
    assert got["concat"] == {"error": "AttributeError: 'NoneType' object has no attribute 'size'"}


def test_value_mode_is_a_flagged_substitute_and_the_path_key_is_logged(value_mode) -> None:
    server, trainer = value_mode
    url = f"{server.url}/compat/openrlhf/key/{trainer}/integ/get_reward"
    got = openrlhf_011(url, [(GOOD, "42"), (GOOD, None)])
    ok, substituted = got["cases"]
    assert ok["rewards"] == [[1.5]] and ok["info"]["reward_error"] == [[0.0]]
    assert substituted["rewards"] == [[0.0]] and substituted["info"]["reward_error"] == [[1.0]]
    assert got["concat"]["rewards"] == [[1.5], [0.0]] and got["concat"]["info"]["reward_error"] == [[0.0], [1.0]]
    assert got["log"] == []
    # OpenRLHF's retry log prints the URL: with the key in the path, the whole key
    revoked = openrlhf_011(f"{server.url}/compat/openrlhf/key/{trainer}x/integ/get_reward", [(GOOD, "42")])
    assert revoked["cases"][0]["reward"] is None
    assert any(line.startswith("Request error, please check: 401") and f"{trainer}x" in line
               for line in revoked["log"])


def test_reward_function_file_through_openrlhf_011s_loader(service: LiveServer, value_mode) -> None:
    """0.11 loads the file with its own loader and calls it with one query; the tensors it returns become
    the sample's reward and logs. A ScoringError is caught by OpenRLHF, logged with our reason, and the sample
    has no reward: the run stops when the samples are joined, in both service modes."""
    env = {"GRPO_CURATOR_URL": service.url, "GRPO_CURATOR_REWARD_SPEC": "integ", "GRPO_CURATOR_API_KEY": ""}
    got = openrlhf_011(str(REWARD_FILE), [(GOOD, "42"), (GOOD, None)], **env)
    assert got["reward_func"]
    ok, failed = got["cases"]
    assert ok["rewards"] == [1.5] and ok["info"]["fmt"] == [1.0] and ok["info"]["correct"] == [1.0]
    assert failed["reward"] is None and failed["rewards"] is None
    assert got["log"][-1].startswith("[SingleTurnExecutor] Failed to fetch reward from remote RM: "
                                     "POST /compat/openrlhf/integ/get_reward: 503 query[0]: could not be scored")
    assert got["concat"] == {"error": "AttributeError: 'NoneType' object has no attribute 'size'"}
    server, trainer = value_mode
    got = openrlhf_011(str(REWARD_FILE), [(GOOD, None)], **{**env, "GRPO_CURATOR_URL": server.url,
                                                            "GRPO_CURATOR_API_KEY": trainer})
    assert got["cases"][0]["reward"] is None
    assert got["log"][-1].endswith("query[0]: could not be scored (1 of 1 items; the service substituted a "
                                   "value: openrlhf_on_error=value)")

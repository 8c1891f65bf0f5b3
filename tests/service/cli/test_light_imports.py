"""Each command imports only what it uses: the settings (read by every command) and the command line load no
reward component, database, web framework or data library a command does not need. Python start-up is most
of a short command's time, and the tests run the CLI hundreds of times. The choices the client commands copy
from the server (so they need not import it) stay equal to the server's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEAVY = ("reward_models.registry", "reward_models.llm_judge", "filters", "numpy", "sqlalchemy", "fastapi",
         "pyarrow", "polars", "alembic", "torch", "transformers", "jsonschema", "psycopg")
# commands whose --help needs nothing beyond argparse and the settings; the client commands also need httpx
BARE = ([], ["serve"], ["migrate"], ["keys"], ["keys", "create"], ["archive"], ["infer"])
CLIENT = (["stats"], ["export"], ["import"])

PROBE = """
import contextlib, io, json, sys
from service.cli.main import main
seen = {}
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([*argv, "--help"])
        except SystemExit:
            pass
    seen[" ".join(argv)] = sorted(m for m in sys.modules if m.split(".")[0] in %r or m in %r)
print(json.dumps(seen))
"""


def _modules_after_help(commands: tuple[list[str], ...], **env: str) -> dict[str, list[str]]:
    """Top-level names of the modules loaded after each ``--help`` (in one process, in order: a later
    command's list includes the earlier ones', so the lists only grow)."""
    tops = tuple({m.split(".")[0] for m in HEAVY} | {"httpx", "rich"})
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_CURATOR_")}
    proc = subprocess.run([sys.executable, "-c", PROBE % (tops, HEAVY), json.dumps(list(commands))],
                          env={**base, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_help_of_the_commands_loads_nothing_heavy():
    seen = _modules_after_help(BARE + CLIENT)
    bare = seen[" ".join(BARE[-1])]
    assert not [m for m in bare if m.split(".")[0] in {*HEAVY, "httpx", "rich"} or m in HEAVY], bare
    loaded = seen[" ".join(CLIENT[-1])]
    assert "httpx" in loaded
    assert not [m for m in loaded if m in HEAVY or m.split(".")[0] in {h for h in HEAVY if "." not in h}], loaded


def test_configured_judge_endpoints_are_still_validated():
    """The settings import reward_models.llm_judge only to check configured endpoints: an invalid one is
    still refused, with pydantic's own message."""
    bad = json.dumps({"j": {"url": "ftp://judge"}})
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_CURATOR_")}
    proc = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**base, "GRPO_CURATOR_JUDGE_ENDPOINTS": bad})
    assert proc.returncode == 1 and "judge_endpoints.j.url String should match pattern" in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", [{}, {"j": {"url": "http://judge:8000/v1", "max_concurrency": 2}}])
def test_judge_endpoints_are_judge_endpoints(value, monkeypatch):
    from reward_models.llm_judge import JudgeEndpoint
    from service.settings import Settings

    monkeypatch.setenv("GRPO_CURATOR_JUDGE_ENDPOINTS", json.dumps(value))
    endpoints = Settings().judge_endpoints
    assert endpoints == {k: JudgeEndpoint(**v) for k, v in value.items()}
    assert all(type(e) is JudgeEndpoint for e in endpoints.values())


def test_the_copied_choices_equal_the_servers():
    from service.auth.service import Role
    from service.cli import export, keys, stats
    from service.export.schemas import EXPORT_FORMATS
    from service.stats.service import STATS_BY

    assert stats.STATS_BY == STATS_BY
    assert export.EXPORT_FORMATS == EXPORT_FORMATS
    assert keys.ROLES == tuple(r.value for r in Role)

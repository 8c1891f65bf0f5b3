"""The command line fails with one clear line and a non-zero exit (tracebacks only with --debug)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from service.client import default_url
from tests.conftest import ROOT


def _cli(*args: str, env: dict[str, str] | None = None, pythonpath: Path | None = None):
    """``python -m service.cli ARGS``; with ``pythonpath`` (a sitecustomize that acts at start-up) a new Python."""
    full = {**os.environ, **(env or {})}
    if pythonpath is not None:
        full["PYTHONPATH"] = os.pathsep.join([str(pythonpath), str(ROOT)])
        return subprocess.run([sys.executable, "-m", "service.cli", *args], env=full, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    return _FORKED.run_env(list(args), full)


@pytest.fixture(autouse=True, scope="module")
def _forked(forked) -> None:
    """The command processes of this module that need no start-up of their own are forked from one zygote
    that imported the CLI (tests/service/cli/commands.py): ~0.45 s of CPU less each."""
    global _FORKED
    _FORKED = forked


_FORKED = None


def _one_line_error(proc) -> str:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def no_torch(tmp_path) -> Path:
    """A sitecustomize that makes torch look uninstalled (import fails, find_spec is None)."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    return tmp_path


@pytest.mark.parametrize("command", [["train", "--help"], ["rollout", "--help"], ["demo"], ["train", "--tiny"]])
def test_trainer_commands_without_the_extra_name_it(no_torch, command):
    line = _one_line_error(_cli(*command, pythonpath=no_torch))
    assert "grpo-curator[trainer]" in line and "make demo" in line and "torch" in line


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["train", "--set", "bogus=1"], "unknown trainer config keys ['bogus']"),
        (["train", "--set", "loss.beta"], "expected KEY=VALUE"),
        (["train", "--set=loss..beta=1"], "expected KEY=VALUE"),
        (["rollout", "--set", "=3"], "expected KEY=VALUE"),
        (["migrate", "--log-level", "loud"], "--log-level 'loud'"),
    ],
)
def test_bad_options(command, words):
    assert words in _one_line_error(_cli(*command))


def test_missing_database_says_how_to_create_it(server_url):
    url = make_url(server_url).set(database="gc_does_not_exist_xyz").render_as_string(hide_password=False)
    line = _one_line_error(_cli("migrate", env={"DATABASE_URL": url}))
    assert 'database "gc_does_not_exist_xyz" does not exist' in line and "createdb" in line


def test_unreachable_database():
    line = _one_line_error(_cli("migrate", env={"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"}))
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in line


def test_not_a_postgres_url():
    assert "expected a postgresql:// URL" in _one_line_error(_cli("migrate", env={"DATABASE_URL": "mysql://h/x"}))


def test_downgrade_at_base_and_unknown_revision(make_db):
    env = {"DATABASE_URL": make_db(migrate=False)}
    assert "no revision that far down" in _one_line_error(_cli("migrate", "--downgrade", "-1", env=env))
    assert "Can't locate revision" in _one_line_error(_cli("migrate", "--revision", "bogus", env=env))
    ok = _cli("migrate", env=env)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr  # quiet by default: no alembic INFO lines
    loud = _cli("--log-level", "info", "migrate", "--downgrade", "base", env=env)
    assert loud.returncode == 0 and "Running downgrade" in loud.stderr


def test_debug_shows_the_traceback():
    proc = _cli("--debug", "train", "--set", "bogus=1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ValueError" in proc.stderr


def test_stats_unreachable_service_and_url_from_the_environment():
    line = _one_line_error(_cli("stats", env={"GRPO_CURATOR_PORT": "1", "GRPO_CURATOR_URL": ""}))
    assert "http://127.0.0.1:1" in line
    line = _one_line_error(_cli("stats", env={"GRPO_CURATOR_URL": "http://127.0.0.1:2/"}))
    assert "http://127.0.0.1:2" in line


def test_default_url(monkeypatch):
    monkeypatch.delenv("GRPO_CURATOR_URL", raising=False)
    monkeypatch.delenv("GRPO_CURATOR_PORT", raising=False)
    assert default_url() == "http://127.0.0.1:8000"
    monkeypatch.setenv("GRPO_CURATOR_PORT", "9123")
    assert default_url() == "http://127.0.0.1:9123"
    monkeypatch.setenv("GRPO_CURATOR_URL", "http://curator:80/")
    assert default_url() == "http://curator:80"


def test_stats_prints_no_request_logs(live_server):
    proc = _cli("stats", "--log-level", "info", env={"GRPO_CURATOR_URL": live_server.url})
    assert proc.returncode == 0, proc.stderr
    assert "HTTP Request" not in proc.stderr + proc.stdout and "reward statistics" in proc.stdout


# Attack: `--log-level warn` passed the CLI's check, then uvicorn raised KeyError after the database was migrated.
def test_serve_with_a_log_level_python_accepts_serves_or_says_so_clearly(fresh_db):
    """`--log-level warn` (or fatal) passes the CLI's check (Python's logging knows WARN / FATAL), then
    uvicorn -- which knows only critical/error/warning/info/debug/trace -- raises KeyError: the user gets
    "error: KeyError: 'warn'", after the database was already migrated."""
    import socket

    env = {**os.environ, "DATABASE_URL": fresh_db, "GRPO_CURATOR_EMBEDDED_WORKER": "false"}
    for level in ("warn", "fatal"):
        with socket.socket() as busy:  # a port in use (port 1 is free to bind for root): serve then fails
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = str(busy.getsockname()[1])
            proc = subprocess.run([sys.executable, "-m", "service.cli", "--log-level", level, "serve", "--port", port],
                                  env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert "KeyError" not in proc.stderr, proc.stderr
        # either it is rejected up front with the accepted levels named, or it runs (the busy port then fails)
        assert "warning" in proc.stderr or "--log-level" in proc.stderr or "address already in use" in proc.stderr, \
            proc.stderr
    bogus = subprocess.run([sys.executable, "-m", "service.cli", "--log-level", "notset", "serve"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert bogus.returncode == 1 and bogus.stderr.strip().splitlines() == [bogus.stderr.strip()], bogus.stderr
    assert "--log-level" in bogus.stderr and "warning" in bogus.stderr, bogus.stderr

"""What a new user hits in the first hour, each answered in one clear line: ``serve --help`` describes its
options with their defaults, ``serve`` on a busy port is one error (no "serving on" first),
``bench.auth`` without DATABASE_URL says what to set, ``import --url`` with a bad host names the URL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.conftest import ROOT


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=120)


def test_serve_help_describes_every_option_with_its_default():
    proc = _run("-m", "service.cli", "serve", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for option, default in (("--host", "127.0.0.1"), ("--port", "8000"), ("--workers", "1")):
        section = text.split(option, 2)[-1][:200]
        assert f"default: {default}" in section, (option, section)
    assert "--insecure-no-auth" in text and "Migrates the database" in text


def test_serve_on_a_busy_port_is_one_error_before_anything_is_printed(fresh_db):
    env = {"DATABASE_URL": fresh_db, "GRPO_CURATOR_EMBEDDED_WORKER": "false"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        proc = _run("-m", "service.cli", "serve", "--port", port, env=env)
    assert proc.returncode == 1
    assert "serving on" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"127.0.0.1:{port}" in lines[0], proc.stderr
    assert "address already in use" in lines[0] and "--port" in lines[0]


def test_bench_auth_without_database_url_says_what_to_set():
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    proc = subprocess.run([sys.executable, "-m", "bench.auth", "--requests", "4"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "KeyError" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "set DATABASE_URL" in proc.stderr and "postgresql://" in proc.stderr


def test_import_with_a_bad_host_names_the_url(tmp_path):
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"id": "p1", "dataset": "toy", "messages": [{"role": "user", "content": "q"}]}\n')
    url = "http://no-such-host.invalid:8000"
    proc = _run("-m", "service.cli", "import", "prompts", str(rows), "--format", "jsonl", "--url", url)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and url in lines[0], proc.stderr

"""import, export and stats share one client configuration (--url / GRPO_CURATOR_URL, --api-key /
GRPO_CURATOR_API_KEY) and name the URL when the service cannot be reached (real command processes, each forked
from one zygote that imported the CLI: tests/service/cli/commands.py)."""

from __future__ import annotations

import pytest

from tests.conftest import free_port
from tests.service.cli.commands import COMMANDS


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "c1", "dataset": "toy", "messages": [{"role": "user", "content": "q"}], '
                    '"reference": {"answer": "1"}}\n')
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unknown_host_names_the_url(command, prompts, forked):
    proc = forked.run([*COMMANDS[command](prompts), "--url", "http://nohost:1"])
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cannot reach the service at http://nohost:1 (unknown host 'nohost')"), line
    assert "Errno" not in line


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_grpo_curator_url_is_honoured(command, prompts, forked):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = forked.run(COMMANDS[command](prompts), GRPO_CURATOR_URL=url)
    assert proc.returncode == 1 and f"cannot reach the service at {url} (connection refused)" in proc.stderr
    assert "127.0.0.1:8000" not in proc.stderr


def test_not_an_http_url_is_refused(prompts, forked):
    proc = forked.run(COMMANDS["export"](prompts), GRPO_CURATOR_URL="curator:8000")
    assert proc.returncode == 1 and "GRPO_CURATOR_URL 'curator:8000': expected an http:// or https:// URL" in proc.stderr


@pytest.fixture(scope="module")
def authed_server(make_db):
    """A real service with auth on (an admin key exists) -> (server, the key); one for the three commands of
    the test below (each only reads, or imports the same prompt again: an upsert)."""
    from service.auth.keys import create_key
    from service.store.db import get_engine, make_sessionmaker
    from tests.conftest import start_server, stop_server

    db = make_db()
    with make_sessionmaker(get_engine(db)).begin() as session:
        token = create_key(session, "cli-admin", "admin", None)
    server = start_server(db)
    try:
        yield server, token
    finally:
        stop_server(server)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_api_key_from_the_environment_and_the_flag(command, prompts, authed_server, forked):
    """With auth on, the key comes from GRPO_CURATOR_API_KEY or --api-key; a wrong one is the service's 401."""
    server, token = authed_server
    ok = forked.run(COMMANDS[command](prompts), GRPO_CURATOR_URL=server.url, GRPO_CURATOR_API_KEY=token)
    assert ok.returncode == 0, ok.stderr
    ok = forked.run([*COMMANDS[command](prompts), "--api-key", token, "--url", server.url])
    assert ok.returncode == 0, ok.stderr
    bad = forked.run([*COMMANDS[command](prompts), "--api-key", "gc_wrong"], GRPO_CURATOR_URL=server.url)
    assert bad.returncode == 1 and ("401" in bad.stderr or "API key" in bad.stderr), bad.stderr

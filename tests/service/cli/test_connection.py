"""One client configuration for every command and adapter (``service.client.resolve_connection``), and no
error line that shows a URL's password or the API key (real command processes, each forked from one zygote
that imported the CLI: tests/service/cli/commands.py; a real service)."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from grpo_curator_integrations._http import target
from service.cli.connection import api_key_of
from service.client import Connection, redact, resolve_connection
from tests.conftest import free_port
from tests.service.cli.commands import COMMANDS

PASSWORD, KEY = "s3cr3t-pw", "gck_0123456789abcdef0123456789abcdef_not-a-real-key"


def _no_secret(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert PASSWORD not in out and KEY not in out and "alice:" not in out, out
    return out


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "c1", "dataset": "toy", "messages": [{"role": "user", "content": "q"}], '
                    '"reference": {"answer": "1"}}\n')
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("via", ["flag", "env"])
def test_an_unreachable_service_is_named_without_its_key(command, via, prompts, forked):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if via == "flag":
        proc = forked.run([*COMMANDS[command](prompts), "--url", url, "--api-key", KEY])
    else:
        proc = forked.run(COMMANDS[command](prompts), GRPO_CURATOR_URL=url, GRPO_CURATOR_API_KEY=KEY)
    assert proc.returncode == 1
    assert f"cannot reach the service at http://127.0.0.1:{port} (connection refused)" in _no_secret(proc)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_url_with_a_password_is_refused_without_showing_it(command, via, prompts, forked):
    """httpx would send ``user:password@`` as Basic auth in place of the Bearer key: refused, named, not shown."""
    url = f"http://alice:{PASSWORD}@127.0.0.1:{free_port()}"
    if via == "flag":
        proc = forked.run([*COMMANDS[command](prompts), "--url", url, "--api-key", KEY])
        source = "--url"
    else:
        proc = forked.run(COMMANDS[command](prompts), GRPO_CURATOR_URL=url, GRPO_CURATOR_API_KEY=KEY)
        source = "GRPO_CURATOR_URL"
    out = _no_secret(proc)
    assert proc.returncode == 1 and f"{source} 'http://***@127.0.0.1:" in out and "user:password@" in out, out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_key_with_a_trailing_newline_is_stripped_and_one_with_a_control_character_refused(command, prompts, forked):
    """A Kubernetes secret's trailing newline: the key is sent stripped (here: no service, so the connection
    is what fails, not the header). A newline inside the key: refused naming the setting, never the key."""
    port = free_port()
    proc = forked.run(COMMANDS[command](prompts), GRPO_CURATOR_URL=f"http://127.0.0.1:{port}", GRPO_CURATOR_API_KEY=KEY + "\n")
    assert "(connection refused)" in _no_secret(proc) and "malformed" not in proc.stderr
    proc = forked.run([*COMMANDS[command](prompts), "--url", f"http://127.0.0.1:{port}", "--api-key", KEY[:8] + "\n" + KEY[8:]])
    out = _no_secret(proc)
    assert proc.returncode == 1 and "--api-key: the API key holds" in out and KEY[8:] not in out, out


def test_a_url_that_is_not_http_is_refused_without_its_password(prompts, forked):
    proc = forked.run(COMMANDS["export"](prompts), GRPO_CURATOR_URL=f"ftp://alice:{PASSWORD}@host/x")
    assert proc.returncode == 1 and "'ftp://***@host/x': expected an http:// or https:// URL" in _no_secret(proc)


def test_help_shows_the_default_url_without_its_password(forked):
    proc = forked.run(["stats", "--help"], GRPO_CURATOR_URL=f"http://alice:{PASSWORD}@curator:8000")
    assert proc.returncode == 0 and "http://***@curator:8000" in _no_secret(proc)


def test_a_refused_key_stays_out_of_every_error(prompts, make_db, forked):
    """The service answers 401 (auth on, a key it does not know): each command's error line does not name the
    key."""
    from service.auth.keys import create_key
    from service.store.db import get_engine, make_sessionmaker
    from tests.conftest import start_server, stop_server

    db = make_db()
    with make_sessionmaker(get_engine(db)).begin() as session:
        create_key(session, "cli-admin", "admin", None)  # a key exists: auth is on
    server = start_server(db)
    try:
        for command, argv in COMMANDS.items():
            proc = forked.run([*argv(prompts), "--url", server.url, "--api-key", KEY])
            assert proc.returncode == 1, (command, proc.stdout)
            assert proc.stderr.startswith("error: "), (command, proc.stderr)
            assert f"{server.url}" in proc.stderr and ": 401 " in proc.stderr, (command, proc.stderr)  # names the URL
            _no_secret(proc)
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    ("text", "secrets", "shown"),
    [
        ("at http://u:p@h:1/x", (), "at http://***@h:1/x"),
        ("at https://only-user@h", (), "at https://***@h"),
        ("no url here", ("",), "no url here"),
        ("key gck_abc in 'gck_abc'", ("gck_abc",), "key *** in '***'"),
        ("pw=p%40ss and http://u:p%40ss@h", ("p%40ss",), "pw=*** and http://***@h"),
        ("mail a@b.c", (), "mail a@b.c"),  # no '//' before it: not a URL's userinfo
        ("at http://user:p@ss@host:1/x", (), "at http://***@host:1/x"),  # the LAST '@' (as httpx reads it)
        ("at http://user:sec ret@host", (), "at http://***@host"),  # whitespace inside userinfo
        ("at HTTP://u:p@h", (), "at HTTP://***@h"),
        ("line1 http://h/x\nmail a@b", (), "line1 http://h/x\nmail a@b"),  # a line end stops it
        ("Illegal header value b'Bearer gck_k\\n'", ("gck_k\n",), "Illegal header value b'Bearer ***'"),
        ("key 'gck_k\\t' and gck_k", ("gck_k\t",), "key '***' and ***"),
        ("b'Bearer k\\xc3\\xa9'", ("k\u00e9",), "b'Bearer ***'"),
    ],
)
def test_redact(text, secrets, shown):
    assert redact(text, *secrets) == shown


def test_a_connection_never_shows_its_key():
    conn = resolve_connection("http://h:1", KEY)
    assert KEY not in repr(conn)
    assert conn.redact(f"failed: {KEY} {conn.url}") == "failed: *** http://h:1"
    assert KEY not in repr(target(conn.url, "s", KEY))


@pytest.mark.parametrize("url", [f"http://alice:{PASSWORD}@h:1", f"https://alice:p@{PASSWORD}@h", "http://only-user@h",
                                 f"http://alice:sec {PASSWORD}@h"])
def test_a_url_with_userinfo_is_refused(url, clean_env):
    with pytest.raises(ValueError, match="user:password@") as err:
        resolve_connection(url, KEY)
    assert PASSWORD not in str(err.value) and "alice" not in str(err.value)


@pytest.mark.parametrize(("given", "sent"), [(KEY + "\n", KEY), (f"  {KEY}\r\n", KEY), ("\n", None), ("", None)])
def test_a_key_is_sent_stripped_and_empty_means_no_key(given, sent, clean_env):
    clean_env.setenv("GRPO_CURATOR_API_KEY", "gck_from_env")
    assert resolve_connection("http://h:1", given).api_key == sent  # '' is explicit: the environment is not read
    clean_env.setenv("GRPO_CURATOR_API_KEY", given)
    assert resolve_connection("http://h:1").api_key == sent


@pytest.mark.parametrize("bad", ["gck_a\nb", "gck_a b", "gck_a\x00b", "gck_\u00e9", "gck_a\x7fb"])
def test_a_key_with_an_inner_control_character_is_refused_by_setting(bad, clean_env):
    with pytest.raises(ValueError, match="^api_key: the API key holds") as err:
        resolve_connection("http://h:1", bad)
    assert bad not in str(err.value) and "gck_a" not in str(err.value)
    if "\x00" in bad:
        return  # no environment variable can hold a NUL
    clean_env.setenv("GRPO_CURATOR_API_KEY", bad)
    with pytest.raises(ValueError, match="^GRPO_CURATOR_API_KEY: the API key holds"):
        resolve_connection("http://h:1")
    with pytest.raises(ValueError, match="^GRPO_CURATOR_API_KEY: "):
        from service.client import CuratorClient
        CuratorClient("http://h:1")


# --- one resolution for every command and adapter ------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch):
    for name in ("GRPO_CURATOR_URL", "GRPO_CURATOR_PORT", "GRPO_CURATOR_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _train_url(argv: list[str]) -> str:
    from trainer.worker import config_from_args

    return config_from_args(["--tiny", *argv])[0].service_url


def _rollout_url(argv: list[str]) -> str:
    from rollout.producer import config_from_args

    return config_from_args(argv)[0].service_url


def _adapter_url(argv: list[str]) -> str:
    url = argv[argv.index("--url") + 1] if "--url" in argv else None
    return target(url, "spec").url


@pytest.mark.parametrize("resolve", [_train_url, _rollout_url, _adapter_url], ids=["train", "rollout", "adapters"])
def test_every_command_resolves_the_url_the_same_way(resolve, clean_env):
    assert resolve([]) == "http://127.0.0.1:8000"
    clean_env.setenv("GRPO_CURATOR_PORT", "9123")
    assert resolve([]) == "http://127.0.0.1:9123"  # the port `serve` listens on
    clean_env.setenv("GRPO_CURATOR_URL", "http://curator:80/")
    assert resolve([]) == "http://curator:80"
    assert resolve(["--url", "http://other:1"]) == "http://other:1"


@pytest.mark.parametrize("resolve", [_train_url, _rollout_url], ids=["train", "rollout"])
def test_a_config_url_sits_between_the_flag_and_the_environment(resolve, clean_env):
    clean_env.setenv("GRPO_CURATOR_URL", "http://env:1")
    assert resolve(["--set", "service_url=http://config:2"]) == "http://config:2"
    assert resolve(["--set", "service_url=http://config:2", "--url", "http://flag:3"]) == "http://flag:3"
    with pytest.raises(ValueError, match="expected an http"):
        resolve(["--url", "curator:8000"])


def test_the_api_key_of_every_command(clean_env):
    assert api_key_of([]) is None and target(None, "s").api_key is None
    clean_env.setenv("GRPO_CURATOR_API_KEY", "env-key")
    assert api_key_of([]) == "env-key" and target(None, "s").api_key == "env-key"
    assert api_key_of(["--set", "x=1", "--api-key", "flag-key"]) == "flag-key"
    assert target(None, "s", "arg-key").api_key == "arg-key"
    assert resolve_connection() == Connection("http://127.0.0.1:8000", "env-key")


@pytest.mark.parametrize(("value", "delay"), [("nan", 1.0), ("NaN", 1.0), ("inf", 1.0), ("-inf", 1.0), ("1e400", 1.0),
                                              ("3", 3.0), ("-2", 0.0), ("99", 10.0), ("Fri, 04 Dec 2026 20:10:00 GMT", 1.0)])
def test_the_clients_retry_after_is_finite(value, delay):
    """``time.sleep(nan)`` raises: a Retry-After that is not a finite number is read as absent (1 s)."""
    from service.client import _retry_after

    assert _retry_after(httpx.Response(503, headers={"Retry-After": value}), cap_s=10.0) == delay

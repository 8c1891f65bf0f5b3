"""The embedded PostgreSQL admits no other local user, not even while it first starts."""

from __future__ import annotations

import os
import subprocess

import pytest

_RACER = r"""
import os, socket, struct, sys, time
path, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
startup = b"".join([struct.pack("!i", 196608), b"user\0postgres\0database\0postgres\0\0"])
seen = False
while time.monotonic() < deadline:
    if not os.path.exists(path):
        time.sleep(0.001); continue
    seen = True
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except PermissionError:
        print("REFUSED"); sys.exit(1)          # locked down before we got in
    except OSError:
        time.sleep(0.001); continue
    try:
        s.sendall(struct.pack("!i", len(startup) + 4) + startup)
        head = s.recv(9)
    except OSError:
        continue
    finally:
        s.close()
    if len(head) == 9 and head[:1] == b"R" and struct.unpack("!i", head[5:9])[0] == 0:
        print("ADMITTED as superuser postgres (trust)"); sys.exit(0)
    time.sleep(0.001)                           # e.g. 'the database system is starting up'
print("TIMEOUT seen=%s" % seen); sys.exit(2)
"""


# Attack: another local user racing the embedded PostgreSQL's first start got in as superuser over a 0777 socket.
def test_another_local_user_cannot_reach_the_embedded_server_while_it_first_starts(tmp_path) -> None:
    """Issue: the embedded PostgreSQL accepts only the service's own connections. When the data
    directory's path is too long for a unix socket, pgserver puts the socket in a 0777 runtime directory
    and the server starts with the default socket mode 0777 and trust auth; lock_down() chmods the socket
    only after get_server() returns. Another local user ('nobody') racing the first start is admitted as
    the superuser (and from there COPY ... TO PROGRAM runs commands as the server's OS user)."""
    import hashlib
    import shutil

    from service.store import db

    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root to run the probe as another user")
    pgdata = tmp_path / ("d" * 90) / "pgdata"  # too long for .s.PGSQL.5432 in the data directory
    pgdata.mkdir(parents=True)
    digest = hashlib.sha256(f"{pgdata}-{pgdata.stat().st_ino}".encode()).hexdigest()[:10]
    import platformdirs

    sock = platformdirs.user_runtime_path("python_PostgresServer") / digest / ".s.PGSQL.5432"
    racer = subprocess.Popen(
        [python, "-c", _RACER, str(sock), "90"], user=65534, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        db.start_embedded(pgdata)
        try:  # the window is over once start_embedded returned (lock_down ran)
            out, err = racer.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            racer.kill()
            out, err = racer.communicate()
    finally:
        if racer.poll() is None:
            racer.kill()
            racer.wait()
        server = db._embedded.pop(str(pgdata.resolve()), None)
        if server is not None:
            server.cleanup()
    assert out.startswith("REFUSED"), (out, err)  # it saw the socket and was refused at its first try


def _venv_bin(root, name: str):
    bin_dir = root / name / "venv" / "lib" / "pginstall" / "bin"
    bin_dir.mkdir(parents=True)
    return bin_dir


# CI: a fresh clone's .venv linked to a virtualenv cached under /root (0700); run as root, pgserver runs initdb as
# its user `pgserver`, opening only the directories on the path as imported: every embedded test failed with
# "Permission denied: .../initdb". The check names the directory that stays closed, and only that one.
def test_a_closed_directory_only_on_the_real_path_to_the_binaries_is_named(tmp_path) -> None:
    from service.store.embedded import check_binaries_reachable, closed_to_others

    home = tmp_path / "home"
    cached = _venv_bin(home / "cache", "grpo")  # home/cache/grpo/venv/...
    home.chmod(0o700)
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(home / "cache" / "grpo" / "venv")
    linked = clone / ".venv" / "lib" / "pginstall" / "bin"
    assert closed_to_others(linked) == home
    # imported from inside the closed home (a clone there with its own .venv): pgserver opens those itself
    assert closed_to_others(cached) is None
    # a closed directory inside the virtualenv is on the imported path too: pgserver opens it
    (home / "cache" / "grpo" / "venv" / "lib").chmod(0o700)
    assert closed_to_others(linked) == home
    home.chmod(0o755)
    assert closed_to_others(linked) is None
    (home / "cache").chmod(0o750)  # group may enter, others not: still closed to `pgserver`
    assert closed_to_others(linked) == home / "cache"
    if os.geteuid() == 0:
        with pytest.raises(RuntimeError, match=f"cannot enter {home / 'cache'} \\(mode 0750\\).*DATABASE_URL"):
            check_binaries_reachable(linked)
        check_binaries_reachable(cached)  # reachable once pgserver opened its prefixes: no error

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



# CI: a fresh clone's .venv linked to a virtualenv under /root (0700); run as root, pgserver runs initdb as its
# user `pgserver`, opening only the directories on the path as imported: every embedded test failed with a bare
# "Permission denied: .../initdb" (helper-49: under umask 077, a missing libpq). After a failed start the
# reason is asked of the system -- the binary run as pgserver runs it -- and named; nothing is refused up front.
def _fake_bin(directory, failing: str | None = None) -> None:
    """pgserver's three binaries as scripts; ``failing`` exits 127 with the loader's message (initdb alone links
    libpq: a real unreadable libpq fails it and not postgres)."""
    from service.store.embedded import PGSERVER_RUNS

    directory.mkdir(parents=True)
    for name in PGSERVER_RUNS:
        body = ('echo "error while loading shared libraries: libpq.so.5" >&2; exit 127' if name == failing
                else f'echo "{name} (PostgreSQL) 16.2"')
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="pgserver runs as another user only as root")
def test_a_start_that_pgservers_user_cannot_run_names_why() -> None:
    import pwd
    import tempfile
    from pathlib import Path

    from pgserver.utils import ensure_user_exists

    from service.store.embedded import closed_to_pgserver, start_failure_reason

    ensure_user_exists("pgserver")
    uid = pwd.getpwnam("pgserver").pw_uid
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="pgprobe-"))
    try:
        base.chmod(0o755)
        _fake_bin(base / "works" / "bin")
        _fake_bin(base / "nolib" / "bin", failing="initdb")
        assert start_failure_reason(base / "works" / "bin") is None
        reason = start_failure_reason(base / "nolib" / "bin")
        assert reason == f"{base}/nolib/bin/initdb fails when that user runs it: error while loading shared libraries: libpq.so.5"
        closed = base / "home"  # root's home: the virtualenv under it, the clone's .venv a link to it
        closed.mkdir(mode=0o700)
        (base / "works").rename(closed / "venv")
        (base / "clone").mkdir()
        (base / "clone" / ".venv").symlink_to(closed / "venv")
        reason = start_failure_reason(base / "clone" / ".venv" / "bin")
        assert reason == f"that user cannot run {base}/clone/.venv/bin/initdb: cannot enter {closed} (mode 0700)"
        # a link under the closed directory that leads out again: the lookup still passes through it
        (closed / "out").symlink_to(base / "nolib")
        (base / "clone2").mkdir()
        (base / "clone2" / ".venv").symlink_to(closed / "out")
        assert closed_to_pgserver(base / "clone2" / ".venv" / "bin" / "postgres", uid) == closed
        assert (base / "clone2" / ".venv").resolve() == base / "nolib"  # the real path alone never shows it
        # helper-50: ".." after a link is the link target's parent, not the text's ("sub/.." is not ".")
        (closed / "inner").mkdir()
        (base / "clone3").mkdir()
        (base / "clone3" / "sub").symlink_to(closed / "inner")
        (base / "clone3" / "venv").mkdir()  # the decoy a textual normalisation would find
        assert closed_to_pgserver(base / "clone3" / "sub" / ".." / "venv" / "bin", uid) == closed
        closed.chmod(0o750)  # group root may enter: pgserver's processes keep root's groups, so it runs
        assert closed_to_pgserver(base / "clone" / ".venv" / "bin" / "postgres", uid) is None
        assert start_failure_reason(base / "clone" / ".venv" / "bin") is None
        closed.chmod(0o705)  # group root's bits apply to a member of group root, not the others': closed
        assert closed_to_pgserver(base / "clone" / ".venv" / "bin" / "postgres", uid) == closed
        assert "cannot enter" in start_failure_reason(base / "clone" / ".venv" / "bin")
        closed.chmod(0o700)
        os.chown(closed, uid, -1)  # its own 0700 directory: the owner's bits, open to it
        assert closed_to_pgserver(base / "clone" / ".venv" / "bin" / "postgres", uid) is None
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)

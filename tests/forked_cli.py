"""Real ``grpo-curator`` command processes without paying Python's start-up for each: a zygote process
imports the CLI (and what its commands import) once, then forks one child per command. Each child is a
separate process running ``service.cli.main.main(argv)`` with its own environment, stdout and stderr
(pipes the test reads), and exit status: what ``python -m service.cli ARGV`` does after its imports.

Used where tests start many command processes: the archiver the kill test SIGKILLs 20 times
(tests/service/archive/test_archive_kill.py), the CLI tests' commands (tests/service/cli), and every
``grpo-curator serve`` that ``tests.conftest.start_server`` starts (~110 a run). Each ``python -m service.cli``
start took ~2 s of imports before the command's first line.

Nothing is connected, configured or cached in the zygote before a fork (it only imports modules); the
child clears the cached settings after taking its environment.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

# what ``grpo-curator archive`` imports (imports only: no thread pool, connection or setting is made by them)
PRELOAD = ("service.cli.main", "service.cli.archive", "service.archive.service", "service.store.db",
           "service.store.migrate", "alembic.command", "alembic.config", "sqlalchemy", "psycopg", "numpy",
           "pyarrow", "pyarrow.fs", "pyarrow.parquet")


class ForkedProcess:
    """The part of ``subprocess.Popen`` the tests use: pid, args, stdout, stderr (text, or bytes when spawned
    with ``text=False``), send_signal, terminate, kill, poll, wait."""

    def __init__(self, zygote: Zygote, pid: int, argv: list[str], stdout: IO[Any], stderr: IO[Any]) -> None:
        self._zygote, self.pid, self.stdout, self.stderr = zygote, pid, stdout, stderr
        self.args = ["service.cli", *argv]
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote._poll(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.002
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked command {self.pid}", timeout or 0)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """``with Zygote() as z: proc = z.spawn(argv, env)``: argv as after ``python -m service.cli``.
    ``preload``: the modules to import before the first fork (default: what ``grpo-curator archive`` imports).
    Safe to use from several threads; a wait never blocks the zygote (it polls)."""

    def __init__(self, cwd: str | None = None, preload: tuple[str, ...] = PRELOAD) -> None:
        self._lock = threading.Lock()
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.forked_cli", str(theirs.fileno()), *preload],
                                      pass_fds=[theirs.fileno()], cwd=cwd)
        theirs.close()
        ready = self._recv(120)
        assert ready == {"ready": True}, ready

    def _recv(self, timeout: float | None) -> dict[str, Any]:
        if not select.select([self._sock], [], [], timeout)[0]:
            raise TimeoutError
        data = self._sock.recv(65536)
        if not data:
            raise RuntimeError(f"the zygote exited ({self._proc.poll()})")
        return json.loads(data)

    def spawn(self, argv: list[str], env: dict[str, str], *, text: bool = True, stdout: bool = True,
              stderr: bool = True, new_session: bool = False) -> ForkedProcess:
        """``stdout=False`` / ``stderr=False``: that stream goes to /dev/null (nobody reads a pipe the command
        could fill); ``new_session``: the child calls setsid() (``Popen``'s start_new_session: ``os.killpg``
        of its pid then reaches every process it started)."""
        r_out, w_out = os.pipe() if stdout else (None, os.open(os.devnull, os.O_WRONLY))
        r_err, w_err = os.pipe() if stderr else (None, os.open(os.devnull, os.O_WRONLY))
        try:
            with self._lock:
                request = {"spawn": argv, "env": env, "setsid": new_session}
                socket.send_fds(self._sock, [json.dumps(request).encode()], [w_out, w_err])
                pid = self._recv(60)["pid"]
        finally:
            os.close(w_out)
            os.close(w_err)
        mode = "r" if text else "rb"
        out = os.fdopen(r_out, mode) if r_out is not None else open(os.devnull, mode)  # noqa: SIM115
        err = os.fdopen(r_err, mode) if r_err is not None else open(os.devnull, mode)  # noqa: SIM115
        return ForkedProcess(self, pid, argv, out, err)

    def _poll(self, pid: int) -> int | None:
        with self._lock:
            self._sock.send(json.dumps({"poll": pid}).encode())
            return self._recv(60)["returncode"]

    def close(self) -> None:
        self._sock.close()  # the zygote ends at EOF
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child(argv: list[str], env: dict[str, str], out: int, err: int, setsid: bool = False) -> None:
    """In the forked child: never returns."""
    code = 1
    try:
        if setsid:
            os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (devnull, out, err):
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        from service.settings import get_settings

        get_settings.cache_clear()
        sys.argv = [sys.argv[0], *argv]
        from service.cli.main import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - what an uncaught exception does: a traceback, exit status 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve(fd: int, preload: list[str]) -> None:
    import importlib

    for name in preload:
        importlib.import_module(name)
    sock = socket.socket(fileno=fd)
    sys.stdout.flush()
    sys.stderr.flush()
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 65536, 2)
        if not msg:
            return
        req = json.loads(msg)
        if "spawn" in req:
            pid = os.fork()
            if pid == 0:
                sock.close()
                _child(req["spawn"], req["env"], fds[0], fds[1], req.get("setsid", False))
            for f in fds:
                os.close(f)
            sock.send(json.dumps({"pid": pid}).encode())
        else:
            done, status = os.waitpid(req["poll"], os.WNOHANG)
            code = os.waitstatus_to_exitcode(status) if done else None
            sock.send(json.dumps({"returncode": code}).encode())


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2:])

"""Sandboxes seen from the trusted side: a warm zygote per sandbox, one forked child per task.

A ``Sandbox`` starts the zygote (``reward_models.sandbox_zygote``) under the chosen backend and talks
to it over a ``SOCK_SEQPACKET`` control socket. ``Sandbox.task`` hands the zygote one end of a fresh
socketpair; the zygote forks a child that owns only that end. The trusted side talks to the child
through a ``Channel`` (length-prefixed JSON frames, a wall-clock deadline from *our* clock, a size
cap) and ends every task with ``Sandbox.finish``: the zygote kills every process the task left,
wipes the scratch directory and reports the child's exit status and output tail.

Sandboxes are reused (``checkout``) while their zygote is healthy. They are started from one
long-lived thread per process, because ``--die-with-parent`` ties a sandbox to the *thread* that
started it. A sandbox has a ``role``: ``program`` runs the candidate; ``harness`` runs the
reference's tests (``reward_models.harness_runner``), in a sandbox of its own (its own namespaces,
never network or subprocesses), so neither the reference nor the program reaches the host or the other.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from reward_models.sandbox_backend import Backend, SandboxError, interpreter, resolve_backend
from reward_models.sandbox_settings import SandboxSettings
from reward_models.sandbox_zygote import zygote_source

_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 16 * 2**20
MAX_LISTING_BYTES = 64 * 2**10  # the program's first frame (its function names), parsed by the supervisor
TMPFS_INODES = 8192  # files + directories per task: bounds the kernel memory (inodes, dentries) it can pin
_STARTUP_S = 30.0
_FINISH_S = 10.0
_HARNESS_PRELOAD = ("ast", "keyword", "traceback", "types", "unittest")
Role = Literal["program", "harness"]
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class ChannelTimeout(Exception):
    """The task's deadline passed while waiting for the program."""


class ChannelBroken(Exception):
    """The program closed its end, or sent something that is not a well-formed frame."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-task limits. ``timeout_s`` is wall time on the trusted side's clock; CPU time is capped at
    ``ceil(timeout_s) + 1`` s; ``max_output_bytes`` is how much of the output tail is kept."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_file_mb: int = 16
    open_files: int = 64
    max_output_bytes: int = 4096

    def rlimits(self, allow_subprocess: bool, allow_network: bool = False) -> dict:
        return {
            "memory_bytes": self.memory_mb * 2**20,
            "cpu_s": int(self.timeout_s) + 2,
            "file_bytes": self.max_file_mb * 2**20,
            "open_files": self.open_files,
            "extra_processes": self.max_processes,  # processes and threads (RLIMIT_NPROC)
            "subprocess": allow_subprocess,  # False: a seccomp filter refuses fork / exec
            "network": allow_network,  # False: sockets of AF_UNIX only (seccomp)
        }


class Channel:
    """The trusted end of one task's socket: frames in and out, all under one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _wait(self) -> None:
        left = self.remaining()
        if left <= 0:
            raise ChannelTimeout
        self.sock.settimeout(left)

    def send(self, obj: dict) -> None:
        self.send_encoded(json.dumps(obj, separators=(",", ":")).encode())

    def send_encoded(self, data: bytes) -> None:
        """One frame whose JSON body the caller encoded (so it can tell its own encoding failures)."""
        try:
            self._wait()
            self.sock.sendall(_HEADER.pack(len(data)) + data)
        except TimeoutError:
            raise ChannelTimeout from None
        except OSError as exc:
            raise ChannelBroken(f"the program closed its channel ({exc.strerror})") from None

    def send_raw(self, data: bytes) -> None:
        self.send_bytes(data)
        self.sock.shutdown(socket.SHUT_WR)

    def send_bytes(self, data: bytes) -> None:
        try:
            self._wait()
            self.sock.sendall(data)
        except TimeoutError:
            raise ChannelTimeout from None
        except OSError as exc:
            raise ChannelBroken(f"the program closed its channel ({exc.strerror})") from None

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (b"" at end of stream)."""
        try:
            self._wait()
            return self.sock.recv(n)
        except ConnectionResetError:  # the program exited leaving input unread: its output came first
            return b""
        except TimeoutError:
            raise ChannelTimeout from None
        except OSError as exc:
            raise ChannelBroken(f"the channel failed ({exc.strerror})") from None

    def _exact(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.read(min(left, 2**20))
            if not chunk:
                raise ChannelBroken(
                    "the program exited" if left == n == _HEADER.size else "a frame was cut short"
                )
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def recv(self, limit: int = MAX_FRAME_BYTES) -> bytes:
        """One frame's body (JSON bytes, not yet parsed), at most ``limit`` bytes; ChannelBroken at end
        of stream or for a bigger frame (nothing of it is read)."""
        (size,) = _HEADER.unpack(self._exact(_HEADER.size))
        if size > limit:
            raise ChannelBroken(f"the program sent a {size}-byte message (limit {limit})")
        return self._exact(size)

    def read_until_eof(self, cap: int) -> tuple[bytes, bool]:
        """Everything until end of stream, or the first ``cap + 1`` bytes; (data, complete)."""
        chunks: list[bytes] = []
        total = 0
        while total <= cap:
            chunk = self.read(min(2**20, cap + 1 - total))
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks), False

    def close(self) -> None:
        self.sock.close()


class Sandbox:
    """One zygote under ``backend``; runs one task at a time."""

    def __init__(self, backend: Backend, settings: SandboxSettings, role: Role = "program") -> None:
        self.backend, self.settings, self.role, self.owner = backend, settings, role, os.getpid()
        self._seq, self.closed = 0, False
        self._tmp = tempfile.mkdtemp(prefix="grpo-sandbox-") if backend.scratch is None else None
        self._log = tempfile.TemporaryFile()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ctrl = ours
        config = {
            "ctrl_fd": theirs.fileno(),
            "scratch": backend.scratch or self._tmp,
            "preload": _HARNESS_PRELOAD if role == "harness" else (),
            # bubblewrap: every task in a PID + mount namespace of its own, on a fresh tmpfs
            "fresh_namespaces": backend.scratch is not None,
            "tmpfs_bytes": settings.tmpfs_mb * 2**20,
            "tmpfs_inodes": TMPFS_INODES,
            "listing_bytes": MAX_LISTING_BYTES,
        }
        cmd = [*backend.prefix, interpreter(), "-I", "-S", "-c", zygote_source(), json.dumps(config)]
        try:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self._tmp or "/",
                env=_ENV,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                pass_fds=(theirs.fileno(),),
            )
        except OSError as exc:
            self.close()
            raise SandboxError(f"could not start the sandbox ({backend.name}): {exc}") from None
        finally:
            theirs.close()
        if "ready" not in self._control(_STARTUP_S):
            tail = self._log_tail()
            self.close()
            raise SandboxError(f"the sandbox ({backend.name}) did not start: {tail}")

    def alive(self) -> bool:
        return not self.closed and self.owner == os.getpid() and self.proc.poll() is None

    def _exited(self, within_s: float) -> bool:
        try:
            self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-800:].decode("utf-8", "replace").strip() or f"exit {self.proc.poll()}"

    def _control(self, timeout_s: float) -> dict:
        """The zygote's next control message; {} when it is gone or silent for ``timeout_s``."""
        self.ctrl.settimeout(timeout_s)
        try:
            data = self.ctrl.recv(2**20)
            return json.loads(data) if data else {}
        except (OSError, ValueError):
            return {}

    def task(self, mode: str, limits: SandboxLimits) -> Channel:
        """Start one task (``fn``, ``io``, ``inproc``; ``harness`` in a harness sandbox) and return the
        channel to its child. SandboxError when this sandbox is gone (closed after an earlier task)."""
        if not self.alive():
            raise SandboxError(f"the sandbox ({self.backend.name}) is closed")
        self._seq += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        message = {
            "op": "run",
            "seq": self._seq,
            "mode": mode,
            "output_bytes": limits.max_output_bytes,
            "limits": limits.rlimits(self.settings.allow_subprocess, self.settings.allow_network),
        }
        try:
            socket.send_fds(self.ctrl, [json.dumps(message).encode()], [theirs.fileno()])
        except OSError as exc:
            ours.close()
            tail = self._log_tail()
            self.close()
            raise SandboxError(f"the sandbox is gone: {exc.strerror}; {tail}") from None
        finally:
            theirs.close()
        return Channel(ours, time.monotonic() + limits.timeout_s)

    def finish(self, channel: Channel, kill: bool) -> dict:
        """End the current task: ``{"exit": status, "output": tail, "clean": bool}`` once nothing of
        it runs."""
        self.stop(channel, kill)
        return self.finished()

    def stop(self, channel: Channel, kill: bool) -> None:
        """The first half of ``finish``: close the channel and (``kill``) tell the zygote to stop the
        task, without waiting (so two sandboxes clean up at once)."""
        channel.close()
        try:
            if kill:
                self.ctrl.send(b'{"op":"kill"}')
        except OSError:
            pass

    def finished(self) -> dict:
        """The second half of ``finish``: the zygote's report. ``clean`` is False (and this sandbox
        closed: the next task gets a fresh one) when it could not wipe what the task left."""
        reply = self._control(_FINISH_S)
        if reply.get("done") == self._seq and reply.get("clean") is True:
            return reply
        crashed = reply.get("done") != self._seq and self._exited(2.0)
        tail = self._log_tail()
        self.close()  # the next task gets a fresh sandbox
        if crashed:  # the zygote cannot be signalled from inside: its death is the infrastructure's
            raise SandboxError(f"the sandbox ({self.backend.name}) stopped answering: {tail}")
        if reply.get("done") == self._seq:
            return dict(reply, clean=False)  # the program left a mess the zygote could not remove
        return {"exit": None, "output": "", "clean": False, "unfinished": "the sandbox could not clean up"}

    def close(self) -> None:
        """Kill the zygote (and so everything in the sandbox); idempotent."""
        self.closed = True
        proc = getattr(self, "proc", None)
        if proc is not None and self.owner == os.getpid() and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.ctrl.close()
        self._log.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


_idle: dict[tuple[SandboxSettings, Role], list[Sandbox]] = {}
_lock = threading.Lock()
_spawners: dict[int, ThreadPoolExecutor] = {}


def _spawner() -> ThreadPoolExecutor:
    """A thread that lives as long as this process (``--die-with-parent`` watches the thread)."""
    with _lock:
        pid = os.getpid()
        if pid not in _spawners:
            _spawners.clear()  # inherited through fork: its thread does not exist here
            _spawners[pid] = ThreadPoolExecutor(1, thread_name_prefix="sandbox-spawner")
        return _spawners[pid]


@atexit.register
def _close_idle() -> None:
    """Stop this process's idle sandboxes (and remove the ``none`` backend's temp dirs) at exit."""
    with _lock:
        sandboxes = [s for pool in _idle.values() for s in pool if s.owner == os.getpid()]
        _idle.clear()
    for sandbox in sandboxes:
        sandbox.close()


def _take(key: tuple[SandboxSettings, Role]) -> Sandbox | None:
    with _lock:
        pool = _idle.setdefault(key, [])
        while pool:
            sandbox = pool.pop()
            if sandbox.alive():
                return sandbox
            if sandbox.owner == os.getpid():
                sandbox.close()
    return None


def harness_settings(settings: SandboxSettings) -> SandboxSettings:
    """The harness sandbox's settings: the deployment's backend, never network or subprocesses."""
    return settings.model_copy(update={"allow_network": False, "allow_subprocess": False})


@contextmanager
def checkout(settings: SandboxSettings, role: Role = "program") -> Iterator[Sandbox]:
    """A healthy sandbox of ``role`` for the settings' backend, returned for reuse afterwards. Raises
    BackendUnavailable (with the install hint) when no acceptable backend works."""
    if role == "harness":
        settings = harness_settings(settings)
    backend = resolve_backend(settings)
    key = (settings, role)
    sandbox = _take(key) or _spawner().submit(Sandbox, backend, settings, role).result()
    try:
        yield sandbox
    except BaseException:
        sandbox.close()
        raise
    if sandbox.alive():
        with _lock:
            _idle.setdefault(key, []).append(sandbox)
    else:
        sandbox.close()

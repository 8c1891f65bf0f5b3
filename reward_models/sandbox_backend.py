"""Which sandbox runs untrusted programs, and the command line that starts one.

``bubblewrap`` (the ``bwrap`` tool) is the standard backend: new user, PID, network, IPC, UTS and
cgroup namespaces, no further user namespaces inside (``--disable-userns``); read-only binds of
``/usr`` and the interpreter's prefix only (its ``site-packages`` hidden under an empty read-only
tmpfs), a fresh ``/proc`` and ``/dev``, ``/`` and ``/dev`` remounted read-only, uid/gid 65534
inside, ``--die-with-parent``, ``--new-session`` and the zygote as PID 1. The zygote keeps
``CAP_SYS_ADMIN`` and ``CAP_SETPCAP`` of the sandbox's own user namespace (``ZYGOTE_CAPS``) to give
each task a PID and mount namespace, a sized tmpfs ``/tmp`` and a covered ``/proc`` of its own; the
task drops every capability before the program runs (``reward_models.sandbox_zygote``). No host
runtime directory (no database socket), no project directory, no ``/etc``, no home directory, no
inherited environment.

The sandbox's uid is never the host's root: a worker running as root starts bubblewrap through
``LAUNCHER``, which drops to the host uid/gid 65534 (no groups, no capabilities) first, so bubblewrap
runs unprivileged and maps the sandbox's uid to host 65534, an account that owns nothing. When the
interpreter lives where 65534 cannot reach it (``/root/.pyenv``), the launcher first covers the
unreachable directory with an empty tmpfs in a mount namespace of its own and binds the
interpreter's prefix back at its path (the host's mounts are untouched). A worker that is not root
cannot change uid: the sandbox's uid then maps to the worker's own unprivileged one.

When bubblewrap does not work the verifier refuses to score (``BackendUnavailable``, with the
install hint) unless the deployment explicitly sets ``backend=none`` (unsafe, documented).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

from reward_models.sandbox_settings import SandboxSettings

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora/RHEL: dnf install bubblewrap; "
    "Alpine: apk add bubblewrap) and let the worker create user namespaces (in a container: see "
    "docs/sandbox.md), or set GRPO_CURATOR_SANDBOX_BACKEND=none to run programs without isolation "
    "(unsafe: only on a machine that holds nothing else)"
)
SANDBOX_UID = 65534
# Run by the interpreter as root: cover unreachable directories, re-bind what the sandbox needs, drop
# to SANDBOX_UID and exec bubblewrap (argv[2:]). Any failure exits 126 naming the step.
LAUNCHER = r"""
import ctypes, json, os, sys
cfg, argv = json.loads(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
def must(ok, what):
    if not ok:
        sys.stderr.write(f"sandbox launcher: {what}: {os.strerror(ctypes.get_errno())}\n")
        os._exit(126)
if cfg["covers"]:
    must(libc.unshare(0x20000) == 0, "unshare(CLONE_NEWNS)")
    must(libc.mount(b"none", b"/", None, 0x44000, None) == 0, "mount --make-rprivate /")  # MS_REC|MS_PRIVATE
    fds = {path: os.open(path, os.O_PATH) for path in cfg["expose"]}  # opened in the new namespace
    for cover in cfg["covers"]:
        must(libc.mount(b"tmpfs", cover.encode(), b"tmpfs", 6, b"mode=0755,size=64k") == 0, "cover " + cover)
    os.umask(0o022)
    for path, fd in fds.items():
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        must(libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, 0x5000, None) == 0, "bind " + path)
        os.close(fd)
os.setgroups([])
os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
os.execv(argv[0], argv)
"""
PROBE = (
    "import ctypes, os; assert os.getpid() == 1 and os.getuid() == 65534; "
    "assert not os.path.exists('/etc/passwd'); "
    "assert not os.access('/proc/slabinfo', os.R_OK), 'the sandbox uid maps to the host root'; "
    "assert ctypes.CDLL(None).unshare(0x20000) == 0, "
    "'no mount namespace per task (CAP_SYS_ADMIN in the sandbox)'"
)
# Kept by the zygote only, in the sandbox's own user namespace (never the host's): it gives each task a
# PID and mount namespace, a tmpfs and a /proc of its own, then the child drops every capability.
ZYGOTE_CAPS = ("CAP_SYS_ADMIN", "CAP_SETPCAP")


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, stopped answering): an error, never a verdict."""


class BackendUnavailable(SandboxError):
    """No backend that meets the guarantees works here, and ``none`` was not chosen."""


@dataclass(frozen=True, slots=True)
class Backend:
    """``name`` as reported in ``details.isolation``; ``prefix`` goes before the interpreter's argv;
    ``scratch`` is the sandbox's writable directory (None: a fresh host temp dir per sandbox)."""

    name: str
    prefix: tuple[str, ...]
    scratch: str | None


def interpreter() -> str:
    """The real interpreter binary (not the virtualenv's link: the sandbox sees no virtualenv)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _interpreter_paths(python: str) -> list[str]:
    """What of the interpreter the sandbox needs bound, beyond ``/usr``."""
    prefix = os.path.realpath(sys.base_prefix)
    paths = [] if (prefix + "/").startswith("/usr/") else [prefix]
    if not python.startswith(("/usr/", prefix + "/")):
        paths.append(python)
    return paths


def _interpreter_binds(python: str) -> list[str]:
    args: list[str] = []
    for path in _interpreter_paths(python):
        args += ["--ro-bind", path, path]
    prefix = os.path.realpath(sys.base_prefix)
    stdlib = os.path.realpath(sysconfig.get_paths(vars={"base": prefix, "installed_base": prefix})["stdlib"])
    for hidden in (os.path.join(stdlib, "site-packages"), os.path.join(stdlib, "dist-packages")):
        if os.path.isdir(hidden):  # empty and read-only: no package, and no place to keep anything
            args += ["--tmpfs", hidden, "--remount-ro", hidden]
    return args


def _unreachable_ancestor(path: str) -> str | None:
    """The first directory above ``path`` that an unrelated uid cannot search, if any."""
    current = "/"
    for part in path.strip("/").split("/")[:-1]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def _launcher(python: str) -> list[str]:
    """The argv that drops a root worker to SANDBOX_UID before bubblewrap; [] when not root."""
    if os.geteuid() != 0:
        return []
    expose = _interpreter_paths(python)
    covers = sorted({c for c in map(_unreachable_ancestor, expose) if c is not None})
    config = {"uid": SANDBOX_UID, "covers": covers, "expose": expose if covers else []}
    return [python, "-I", "-S", "-c", LAUNCHER, json.dumps(config)]


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def bwrap_prefix(settings: SandboxSettings, bwrap: str) -> tuple[str, ...]:
    """The bubblewrap command line up to (not including) the interpreter."""
    args = [*_launcher(interpreter()), bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    args += ["--die-with-parent", "--new-session", "--as-pid-1"]
    if settings.allow_network:
        args.append("--share-net")
    args += ["--cap-drop", "ALL", *[a for cap in ZYGOTE_CAPS for a in ("--cap-add", cap)]]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    args += _system_binds() + _interpreter_binds(interpreter())
    # The zygote's /proc stays whole (the kernel lets a task mount its own /proc only then); each
    # task's fresh /proc gets the covers (reward_models.sandbox_zygote.PROC_DIRS / PROC_FILES).
    args += ["--proc", "/proc", "--dev", "/dev"]
    if _supports_size(bwrap):  # bubblewrap >= 0.8; older ones give /tmp the kernel's default size
        args += ["--size", str(settings.tmpfs_mb * 2**20)]
    args += ["--tmpfs", "/tmp", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    return tuple(args)


@functools.lru_cache(maxsize=4)
def _supports_size(bwrap: str) -> bool:
    try:
        run = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"--size" in run.stdout + run.stderr


def _probe(prefix: tuple[str, ...]) -> str | None:
    """None when the sandbox starts and looks right, else why not."""
    try:
        run = subprocess.run(
            [*prefix, interpreter(), "-I", "-S", "-c", PROBE],
            capture_output=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if run.returncode != 0:
        return (run.stderr.decode("utf-8", "replace").strip() or f"exit {run.returncode}")[-500:]
    return None


@functools.lru_cache(maxsize=8)
def _bubblewrap(settings: SandboxSettings) -> Backend | str:
    bwrap = shutil.which(settings.bwrap)
    if bwrap is None:
        return f"bubblewrap ({settings.bwrap!r}) is not installed"
    prefix = bwrap_prefix(settings, bwrap)
    problem = _probe(prefix)
    if problem is not None:
        return f"bubblewrap cannot start a sandbox here: {problem}"
    return Backend("bubblewrap", prefix, "/tmp")


def resolve_backend(settings: SandboxSettings) -> Backend:
    """The backend the settings ask for, probed once per process; BackendUnavailable (naming what is
    missing and how to install it) when it does not work."""
    if settings.backend == "none":
        return Backend("none (unsafe)", (), None)
    found = _bubblewrap(settings)
    if isinstance(found, str):
        _bubblewrap.cache_clear()  # probe again next time: someone may install it meanwhile
        raise BackendUnavailable(f"verifier.code refuses to run programs: {found}; {INSTALL_HINT}")
    return found


def describe_backend(settings: SandboxSettings) -> str:
    """One line for the worker's start-up log; never raises."""
    try:
        backend = resolve_backend(settings)
    except BackendUnavailable as exc:
        return f"unavailable: {exc}"
    if backend.prefix:
        bwrap = shutil.which(settings.bwrap)
        uid = SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
        network = "on" if settings.allow_network else "off"
        return f"{backend.name} ({bwrap}), host uid {uid}, network={network}"
    return "none: UNSAFE, programs run without isolation (GRPO_CURATOR_SANDBOX_BACKEND=none)"

"""The program the code sandbox runs first (``python -I -c BOOT config``), kept as source text.

It reads a one-time token from stdin and both sources (before any of them runs, so the solution
cannot rewrite the tests), applies resource limits, installs an audit hook (no network, no new
processes, no ctypes loading), starts a wall-clock watchdog, writes "ready" to the status pipe, runs
the solution then the tests in one ``__main__`` namespace and, only if the tests finished, writes
the token to the status pipe.
A ``SystemExit`` from the solution (e.g. ``sys.exit(0)`` before the tests) is a failure; one from
the tests counts with its code (``unittest.main()`` exits 0 on success).

The audit hook is a guard against accidents, not a security boundary: the namespaces (network and
PID, when ``unshare`` works), the rlimits and the killed process tree are the hard limits.
"""

BOOT = r"""
import json, os, resource, socket, sys, threading, time
cfg = json.loads(sys.argv[1])
token = sys.stdin.readline().strip()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
SETUP_FAILED = 125

def _count_tasks(uid):
    total = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            pass
    return total

def _limits():
    import ctypes
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG = SIGKILL
    nproc = cfg["max_processes"] + (_count_tasks(os.getuid()) if cfg["nproc_relative"] else 0)
    for name, value in (("RLIMIT_AS", cfg["memory_bytes"]), ("RLIMIT_CPU", cfg["cpu_s"]),
                        ("RLIMIT_FSIZE", cfg["file_bytes"]), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NPROC", nproc)):
        resource.setrlimit(getattr(resource, name), (value, value))

PROC_EVENTS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
               "subprocess.Popen", "pty.spawn"}
NET_EVENTS = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
              "socket.gethostbyaddr", "socket.getnameinfo"}

def _hook(event, args):
    if not cfg["allow_network"]:
        if event == "socket.__new__" and args[1] != socket.AF_UNIX:
            raise PermissionError("sandbox: network access is disabled")
        if event in ("socket.connect", "socket.sendto", "socket.bind") and not isinstance(args[1], (str, bytes)):
            raise PermissionError("sandbox: network access is disabled")
        if event in NET_EVENTS:
            raise PermissionError("sandbox: network access is disabled")
    if not cfg["allow_subprocess"] and event in PROC_EVENTS:
        raise PermissionError("sandbox: creating processes is disabled")
    if event in ("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle"):
        raise PermissionError("sandbox: ctypes is disabled")

def _watchdog():
    time.sleep(cfg["wall_s"])
    os._exit(124)

def _compile(path):
    with open(path) as fh:
        return compile(fh.read(), path, "exec")

try:
    solution, tests = _compile("solution.py"), _compile("tests.py")
except SyntaxError as exc:  # the program's fault, not the sandbox's: report it like Python would
    solution = tests = None
    syntax_error = exc
try:
    _limits()
    sys.addaudithook(_hook)
    threading.Thread(target=_watchdog, daemon=True).start()
    os.write(cfg["status_fd"], b"ready\n")
except BaseException as exc:
    print(f"sandbox setup failed: {exc!r}", file=sys.stderr)
    os._exit(SETUP_FAILED)

import types
_main = types.ModuleType("__main__")
sys.modules["__main__"] = _main
namespace = _main.__dict__
sys.argv = ["solution.py"]

if solution is None:
    raise syntax_error
try:
    exec(solution, namespace)
except SystemExit:
    print("sandbox: the solution exited before the tests ran", file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)
try:
    exec(tests, namespace)
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
os.write(cfg["status_fd"], (token + "\n").encode())
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""

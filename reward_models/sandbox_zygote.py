"""The zygote: the one long-lived process inside a sandbox, kept as source text.

Started once per sandbox (``python -I -S -c SOURCE config``) with stdlib modules preloaded, it
waits on its control socket for a task (a small JSON message carrying one end of a fresh socketpair)
and forks one child per task. The child gets its own session, a fresh working directory, rlimits and
that socket only; then it runs the candidate program (``fn`` mode: define functions and answer calls
with plain data; ``io`` mode: the socket is its stdin and stdout; ``inproc`` mode: run solution and
tests and say "finished"). When the child exits, or when the harness says "kill", the zygote kills
every other process it can see, reaps them, wipes the scratch directory and reports the child's exit
status and the tail of its stderr.

Under bubblewrap the zygote is PID 1 of its PID namespace (``--as-pid-1``): a program inside cannot
signal it (the kernel drops signals to a namespace's init that it has no handler for), and it is not
dumpable, so same-uid programs cannot ptrace it or open its ``/proc/1/fd``. Killing "everything but
me" is then ``kill(-1, SIGKILL)``, which no double-fork or ``setsid`` escapes.
"""

from pathlib import Path

_BODY = r'''
import builtins, json, os, resource, select, signal, socket, stat, struct, sys, traceback, types
import ctypes
CFG = json.loads(sys.argv[1])
for _name in ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
              "fractions", "decimal", "statistics", "typing", "dataclasses", "copy", "operator",
              "random", "hashlib", "array", "datetime", "io", *CFG.get("preload", ())):
    __import__(_name)
CTRL = socket.socket(fileno=CFG["ctrl_fd"])
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: no ptrace, no /proc/<pid>/fd by the programs
PID1 = os.getpid() == 1
SCRATCH = CFG["scratch"]
OUT = os.path.join(SCRATCH, ".output")
HEADER = struct.Struct(">I")


def send_frame(sock, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(len(data)) + data)


def recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock):
    head = recv_exact(sock, HEADER.size)
    if head is None:
        return None
    body = recv_exact(sock, HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)


def count_tasks(uid):
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            pass
    return total


def set_limits(lim):
    nproc = count_tasks(os.getuid()) + lim["extra_processes"]  # threads count too
    for name, value in (("RLIMIT_AS", lim["memory_bytes"]), ("RLIMIT_CPU", lim["cpu_s"]),
                        ("RLIMIT_FSIZE", lim["file_bytes"]), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NOFILE", lim["open_files"]), ("RLIMIT_NPROC", nproc)):
        soft, hard = resource.getrlimit(getattr(resource, name))
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(getattr(resource, name), (value, value))


SYSCALLS = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
                            "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240, "memfd_create": 319,
                            "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308,
                            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}),
    "aarch64": (0xC00000B7, {"clone": 220, "execve": 221, "execveat": 281, "shmget": 194, "semget": 190,
                             "msgget": 186, "mq_open": 180, "memfd_create": 279, "add_key": 217,
                             "request_key": 218, "keyctl": 219, "unshare": 97, "setns": 268,
                             "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}),
}
# Always refused: SysV / POSIX IPC objects outlive the task in the sandbox's shared IPC namespace
# (a channel to the next sample) and, like memfds, hold memory that RLIMIT_AS does not count; kernel
# keyrings are shared by every task of the uid (and reach the host's when it is the worker's); new or
# other namespaces and io_uring are kernel attack surface a program never needs.
NO_KEEPERS = ("shmget", "semget", "msgget", "mq_open", "memfd_create", "add_key", "request_key", "keyctl",
              "unshare", "setns", "io_uring_setup", "io_uring_enter", "io_uring_register")
NO_PROCESSES = ("fork", "vfork", "execve", "execveat")
CLONE_THREAD = 0x10000
CLONE_NEW_NAMESPACES = 0x7E020080  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME


def seccomp_program(deny_processes):
    """A seccomp filter: no IPC objects, memfds, keyrings, namespaces (``unshare``, ``setns``, ``clone``
    with a CLONE_NEW* flag) or io_uring; with ``deny_processes`` also no fork / vfork / exec and clone
    only for threads. ``clone3`` (whose flags a filter cannot read) answers ENOSYS, so the C library
    falls back to ``clone``. It holds whatever uid the program runs as. Built once, installed in each
    child."""
    arch, nrs = SYSCALLS[os.uname().machine]
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, kill), (0x20, 0, 0, 0),
            (0x35, 0, 1, 0x40000000), (0x06, 0, 0, kill)]
    for name in NO_KEEPERS + (NO_PROCESSES if deny_processes else ()):
        if name in nrs:
            prog += [(0x15, 0, 1, nrs[name]), (0x06, 0, 0, eperm)]
    prog += [(0x15, 0, 1, 435), (0x06, 0, 0, enosys)]
    # clone: load the flags (args[0], low 32 bits); namespaces never, processes only when allowed
    branch = [(0x20, 0, 0, 16), (0x45, 0, 1, CLONE_NEW_NAMESPACES), (0x06, 0, 0, eperm)]
    if deny_processes:
        branch += [(0x45, 1, 0, CLONE_THREAD), (0x06, 0, 0, eperm)]
    branch.append((0x06, 0, 0, allow))
    prog += [(0x15, 0, len(branch), nrs["clone"]), *branch, (0x06, 0, 0, allow)]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(prog))(*[Filter(*ins) for ins in prog])
    return Program(len(prog), filters), filters


SECCOMP = {deny: seccomp_program(deny) for deny in (False, True)}
LIBC = ctypes.CDLL(None, use_errno=True)


def install_filter(deny_processes):
    program = SECCOMP[deny_processes][0]
    if LIBC.prctl(38, 1, 0, 0, 0) != 0 or LIBC.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter")


def describe(exc):
    return f"{type(exc).__name__}: {exc}"[:2000]


def unwrapped_code(value):
    """The code object under a function or its decorators (functools.wraps / lru_cache / cache)."""
    for _ in range(16):
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType):
            return code
        value = getattr(value, "__wrapped__", None)
    return None


def callables(namespace):
    """(every callable top-level name that is not a class or module, those the program wrote)."""
    names, own = [], []
    for name, value in list(namespace.items()):
        if callable(value) and not isinstance(value, (type, types.ModuleType)):
            names.append(name)
            code = unwrapped_code(value)
            if code is not None and code.co_filename == "<candidate>":
                own.append(name)
    return names, own


def answer(namespace, call):
    try:
        args = [from_plain(arg) for arg in call["args"]]  # one by one: what came out can go back in
        kwargs = {str(key): from_plain(value) for key, value in call["kwargs"]}
        reply = {"value": to_plain(namespace[call["fn"]](*args, **kwargs))}
    except PlainDataError as exc:
        reply = {"not_plain": describe(exc)}
    except BaseException as exc:
        reply = {"raised": type(exc).__name__, "message": str(exc)[:2000]}
    try:
        return json.dumps(reply, separators=(",", ":")).encode()
    except (ValueError, RecursionError) as exc:
        return json.dumps({"not_plain": describe(exc)}).encode()


def run_fn(sock, task):
    # Not "__main__": an "if __name__ == '__main__':" demo block is not part of the function.
    namespace = {"__name__": "solution", "__builtins__": builtins}
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        exec(compile(task["source"], "<candidate>", "exec"), namespace)
    except BaseException as exc:
        traceback.print_exc()
        send_frame(sock, {"error": describe(exc)})
        return
    names, own = callables(namespace)
    send_frame(sock, {"defined": names, "own": own})
    while (call := recv_frame(sock)) is not None:
        body = answer(namespace, call)
        sock.sendall(HEADER.pack(len(body)) + body)


def run_io(sock, task):
    os.dup2(sock.fileno(), 0)
    os.dup2(sock.fileno(), 1)
    sock.close()
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(task["source"], "<candidate>", "exec"), namespace)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        os._exit(code)
    sys.stdout.flush()


def run_inproc(sock, task):
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(task["source"], "<candidate>", "exec"), namespace)
    try:
        exec(compile(task["tests"], "<tests>", "exec"), namespace)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    send_frame(sock, {"finished": True})


MODES = {"fn": run_fn, "io": run_io, "inproc": run_inproc}  # "harness": run_harness, its own protocol


def child(task, fd):
    code = 0
    try:
        os.setsid()
        CTRL.close()
        workdir = os.path.join(SCRATCH, "work")
        os.chdir(workdir)
        out = os.open(OUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open("/dev/null", os.O_RDWR)
        for target, source in ((0, null), (1, out), (2, out)):
            os.dup2(source, target)
        os.close(out)
        os.close(null)
        sock = socket.socket(fileno=fd)
        set_limits(task["limits"])
        install_filter(deny_processes=not task["limits"]["subprocess"])
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(0)  # the program's own CPU time: behave like an unlimited int
        if task["mode"] == "harness":
            run_harness(sock)
        elif (sock_task := recv_frame(sock)) is not None:
            MODES[task["mode"]](sock, sock_task)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def kill_child(pid):
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kill_rest(pid):
    kill_child(pid)
    if PID1:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def output_tail(limit):
    """The tail of the task's output file; never blocks on, or follows, what the program put there."""
    try:
        fd = os.open(OUT, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        size = os.lseek(fd, 0, os.SEEK_END)
        os.lseek(fd, max(size - limit, 0), os.SEEK_SET)
        text = os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
    return "[truncated]\n" + text if size > limit else text


DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def wipe(path):
    """Remove everything under ``path``: no recursion and no long paths (a 3,000-deep tree is fine),
    every directory opened relative to its parent and made searchable first (chmod 0 is fine)."""
    os.chmod(path, 0o700)
    names, fd = [], os.open(path, DIRECTORY)
    try:
        while True:
            deeper = None
            for entry in os.scandir(fd):
                if entry.is_dir(follow_symlinks=False):
                    deeper = entry.name
                    break
                os.unlink(entry.name, dir_fd=fd)
            if deeper is not None:  # go down (nothing runs any more that could swap it)
                os.chmod(deeper, 0o700, dir_fd=fd)
                child = os.open(deeper, DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(deeper)
            elif any(True for _ in os.scandir(fd)):
                continue  # entries the listing missed while others were removed
            elif names:  # empty: go up and remove it
                parent = os.open("..", DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(names.pop(), dir_fd=fd)
            else:
                return
    finally:
        os.close(fd)


BASELINE = []


def fresh_scratch():
    """Empty the scratch directory and make the next work dir, then prove it: nothing but the work
    dir is left and (on the sandbox's own tmpfs) every block and inode is free again. False when the
    program's leftovers resist (the harness then replaces this whole sandbox)."""
    try:
        wipe(SCRATCH)
        os.mkdir(os.path.join(SCRATCH, "work"))
        if os.listdir(SCRATCH) != ["work"] or os.listdir(os.path.join(SCRATCH, "work")):
            return False
        if CFG.get("verify_free"):
            usage = os.statvfs(SCRATCH)
            BASELINE[:] = BASELINE or [usage.f_bfree, usage.f_ffree]
            return [usage.f_bfree, usage.f_ffree] == BASELINE
        return True
    except (OSError, RecursionError):
        return False


def supervise(pid):
    pidfd = os.pidfd_open(pid)
    status = None
    try:
        while status is None:
            ready, _, _ = select.select([CTRL, pidfd], [], [])
            if pidfd in ready:
                status = os.waitpid(pid, 0)[1]
            elif not CTRL.recv(4096):
                kill_rest(pid)
                os._exit(0)
            else:
                kill_child(pid)
    finally:
        os.close(pidfd)
    return os.waitstatus_to_exitcode(status)


def serve():
    if not fresh_scratch():
        os._exit(125)
    CTRL.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        message, fds, _, _ = socket.recv_fds(CTRL, 65536, 1)
        if not message:
            os._exit(0)
        task = json.loads(message)
        if task.get("op") != "run" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue  # a "kill" that arrived after its task had ended
        pid = os.fork()
        if pid == 0:
            child(task, fds[0])
        os.close(fds[0])
        code = supervise(pid)
        kill_rest(pid)
        reply = {"done": task["seq"], "exit": code, "output": output_tail(task["output_bytes"])}
        clean = fresh_scratch()
        reply["clean"] = clean
        try:
            CTRL.send(json.dumps(reply).encode())
        except OSError:  # e.g. an output tail too big for one message: the verdict needs no output
            CTRL.send(json.dumps(dict(reply, output="[output dropped]")).encode())
        if not clean:
            os._exit(0)


serve()
'''


def zygote_source() -> str:
    """The zygote program: the plain-data codec, the harness's test runner, then the loop above (stdlib
    only)."""
    here = Path(__file__).parent
    parts = [(here / name).read_text(encoding="utf-8") for name in ("plaindata.py", "harness_runner.py")]
    return "\n".join([*parts, _BODY])

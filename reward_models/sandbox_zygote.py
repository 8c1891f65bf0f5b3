"""The zygote: the one long-lived process inside a sandbox, kept as source text.

Started once per sandbox (``python -I -S -c SOURCE config``) with stdlib modules preloaded, it
waits on its control socket for a task (a small JSON message carrying one end of a fresh socketpair)
and forks one child per task. The child gets its own session, a fresh working directory, rlimits and
that socket only; then it runs the candidate program (``fn`` mode: define functions and answer calls
with plain data; ``io`` mode: the socket is its stdin and stdout; ``inproc`` mode: run solution and
tests and say "finished"). When the child exits, or when the harness says "kill", the zygote kills
every other process it can see, reaps them, wipes the scratch directory and reports the child's exit
status and the tail of its stderr.

Under bubblewrap the zygote is PID 1 of its PID namespace (``--as-pid-1``) and keeps two
capabilities of the sandbox's own user namespace (``CAP_SYS_ADMIN``, ``CAP_SETPCAP``; nothing of the
host's) for one purpose: every task starts from nothing. The child is created with ``clone(CLONE_NEWPID
| CLONE_NEWNS)``: it is PID 1 of a PID namespace of its own (its pids, ``/proc/loadavg`` and
``/proc/1`` are the same in every task; when it exits the kernel kills whatever it left), and in a
mount namespace of its own it gets a fresh tmpfs as ``/tmp`` (made by the zygote with ``fsopen``,
sized, with an inode limit: inode numbers start over, nothing of an earlier task is on it) and a fresh
``/proc`` holding its processes only (no kernel knobs, no machine-wide counters). Then it drops every capability
(bounding, ambient, effective, permitted; securebits locked), sets ``no_new_privs`` and installs the
seccomp filter before any program code runs. The program cannot see the zygote (another PID
namespace), signal it or ptrace it (it is not dumpable). ``kill(-1, SIGKILL)`` from the zygote still
removes every process a program left.
"""

from pathlib import Path

_BODY = r'''
import builtins, json, os, random, resource, select, signal, socket, stat, struct, sys, traceback, types
import ctypes
CFG = json.loads(sys.argv[1])
for _name in ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
              "fractions", "decimal", "statistics", "typing", "dataclasses", "copy", "operator",
              "random", "hashlib", "array", "datetime", "io", *CFG.get("preload", ())):
    __import__(_name)
CTRL = socket.socket(fileno=CFG["ctrl_fd"])
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: no ptrace, no /proc/<pid>/fd by the programs
PID1 = os.getpid() == 1
FRESH = bool(CFG.get("fresh_namespaces")) and PID1  # a PID + mount namespace and a new tmpfs per task
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


def set_limits(lim, tasks):
    nproc = tasks + lim["extra_processes"]  # threads count too
    for name, value in (("RLIMIT_AS", lim["memory_bytes"]), ("RLIMIT_CPU", lim["cpu_s"]),
                        ("RLIMIT_FSIZE", lim["file_bytes"]), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NOFILE", lim["open_files"]), ("RLIMIT_NPROC", nproc)):
        soft, hard = resource.getrlimit(getattr(resource, name))
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(getattr(resource, name), (value, value))


SYSCALLS = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
                            "socket": 41, "socketpair": 53, "capset": 126,
                            "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240, "memfd_create": 319,
                            "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308,
                            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                            "fadvise64": 221, "readahead": 187, "mincore": 27, "preadv2": 327, "pwritev2": 328,
                            "cachestat": 451, "sched_setaffinity": 203, "perf_event_open": 298,
                            "madvise": 28}),
    "aarch64": (0xC00000B7, {"clone": 220, "execve": 221, "execveat": 281, "shmget": 194, "semget": 190,
                             "socket": 198, "socketpair": 199, "capset": 91,
                             "msgget": 186, "mq_open": 180, "memfd_create": 279, "add_key": 217,
                             "request_key": 218, "keyctl": 219, "unshare": 97, "setns": 268,
                             "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                             "fadvise64": 223, "readahead": 213, "mincore": 232, "preadv2": 286,
                             "pwritev2": 287, "cachestat": 451, "sched_setaffinity": 122,
                             "perf_event_open": 241, "madvise": 233}),
}
# Always refused: SysV / POSIX IPC objects outlive the task in the sandbox's shared IPC namespace
# (a channel to the next sample) and, like memfds, hold memory that RLIMIT_AS does not count; kernel
# keyrings are shared by every task of the uid (and reach the host's when it is the worker's); new or
# other namespaces and io_uring are kernel attack surface a program never needs.
# The host's page cache is shared with every sandbox (the read-only /usr, the interpreter): a task that evicts
# pages of a shared file (fadvise, madvise COLD / PAGEOUT) and the next one that probes which are cached
# (mincore, preadv2 RWF_NOWAIT, cachestat, readahead) pass bits between samples. Pinning to a CPU
# (sched_setaffinity) lets a task steer the per-CPU inode-number counter of pipes and sockets for the next
# one; perf_event_open is kernel attack surface. A program needs none of them.
NO_CHANNELS = ("fadvise64", "readahead", "mincore", "preadv2", "pwritev2", "cachestat", "sched_setaffinity",
               "perf_event_open")
NO_KEEPERS = ("shmget", "semget", "msgget", "mq_open", "memfd_create", "add_key", "request_key", "keyctl",
              "unshare", "setns", "io_uring_setup", "io_uring_enter", "io_uring_register") + NO_CHANNELS
MADV_COLD, MADV_PAGEOUT = 20, 21
NO_PROCESSES = ("fork", "vfork", "execve", "execveat")
CLONE_THREAD = 0x10000
CLONE_NEW_NAMESPACES = 0x7E020080  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10


def seccomp_program(deny_processes, network):
    """A seccomp filter: no IPC objects, memfds, keyrings, namespaces (``unshare``, ``setns``, ``clone``
    with a CLONE_NEW* flag) or io_uring; sockets of ``AF_UNIX`` only (``AF_INET`` / ``AF_INET6`` too
    with ``network``; never ``AF_VSOCK``, netlink, packet, ...: a vsock port space is shared by every
    sandbox of the machine), others answer EAFNOSUPPORT; with ``deny_processes`` also no fork / vfork
    / exec and clone only for threads. ``clone3`` (whose flags a filter cannot read) answers ENOSYS, so
    the C library falls back to ``clone``. It holds whatever uid the program runs as. Built once,
    installed in each child."""
    arch, nrs = SYSCALLS[os.uname().machine]
    allow, eperm, enosys, eafnosupport, kill = 0x7FFF0000, 0x00050001, 0x00050026, 0x00050061, 0x80000000
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, kill), (0x20, 0, 0, 0),
            (0x35, 0, 1, 0x40000000), (0x06, 0, 0, kill)]
    for name in NO_KEEPERS + (NO_PROCESSES if deny_processes else ()):
        if name in nrs:
            prog += [(0x15, 0, 1, nrs[name]), (0x06, 0, 0, eperm)]
    prog += [(0x15, 0, 1, 435), (0x06, 0, 0, enosys)]
    families = (AF_UNIX, AF_INET, AF_INET6) if network else (AF_UNIX,)
    for name in ("socket", "socketpair"):  # load the family (args[0]); the accumulator is the nr again after
        block = [(0x20, 0, 0, 16)]
        for family in families:
            block += [(0x15, 0, 1, family), (0x06, 0, 0, allow)]
        block.append((0x06, 0, 0, eafnosupport))
        prog += [(0x15, 0, len(block), nrs[name]), *block]
    # madvise: load the advice (args[2]); COLD / PAGEOUT push pages out of the shared page cache
    block = [(0x20, 0, 0, 32), (0x15, 0, 1, MADV_COLD), (0x06, 0, 0, eperm), (0x15, 0, 1, MADV_PAGEOUT),
             (0x06, 0, 0, eperm), (0x06, 0, 0, allow)]
    prog += [(0x15, 0, len(block), nrs["madvise"]), *block]
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


SECCOMP = {(deny, net): seccomp_program(deny, net) for deny in (False, True) for net in (False, True)}
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long


def blur_inode_counter():
    """Move the host's inode-number counter of pipes and sockets by a random amount (0-1023) before the
    program starts: the low bits a previous task could have set are noise (with sched_setaffinity refused it
    cannot pin itself to the CPU whose counter it moved). A residual, documented: the coarse global counter."""
    for _ in range(int.from_bytes(os.urandom(2), "little") % 1024):
        r, w = os.pipe()
        os.close(r)
        os.close(w)


def install_filter(deny_processes, network):
    program = SECCOMP[deny_processes, network][0]
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


def listing(names, own, budget):
    """The names for the supervisor, within its size limit: the program's own first, then imported
    ones (``from math import *``) while they fit."""
    own_names = set(own)
    kept, kept_own, size = [], [], 0
    for name in own + [n for n in names if n not in own_names]:
        cost = (len(json.dumps(name)) + 1) * (2 if name in own_names else 1)
        if size + cost > budget:
            break
        size += cost
        kept.append(name)
        if name in own_names:
            kept_own.append(name)
    return {"defined": kept, "own": kept_own}


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
    send_frame(sock, listing(names, own, CFG.get("listing_bytes", 65536) - 64))
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


def child(task, fd, fresh_tmp, out, tasks):
    code = 0
    try:
        os.setsid()
        CTRL.close()
        if fresh_tmp is not None:
            enter_fresh_namespaces(fresh_tmp)
        workdir = os.path.join(SCRATCH, "work")
        os.chdir(workdir)
        if out is None:
            out = os.open(OUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open("/dev/null", os.O_RDWR)
        for target, source in ((0, null), (1, out), (2, out)):
            os.dup2(source, target)
        os.close(out)
        os.close(null)
        sock = socket.socket(fileno=fd)
        if fresh_tmp is not None:
            drop_capabilities()
            random.seed()  # what os.fork's hooks do; clone() skips them
        blur_inode_counter()
        set_limits(task["limits"], tasks)
        install_filter(not task["limits"]["subprocess"], task["limits"].get("network", False))
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


def must(result, what):
    if result < 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
    return result


def syscall(nr, *args):
    return LIBC.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])


# The new mount API (same numbers on every architecture): the zygote makes each task's tmpfs detached,
# the child attaches it as /tmp in its own mount namespace.
FSOPEN, FSCONFIG, FSMOUNT, MOVE_MOUNT = 430, 431, 432, 429
CLONE_NEWNS, CLONE_NEWPID, SIGCHLD = 0x20000, 0x20000000, 17
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
if FRESH:
    must(LIBC.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")  # a mount namespace the zygote may change
    must(LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    TMPFS = [(b"size", str(CFG["tmpfs_bytes"]).encode()), (b"nr_inodes", str(CFG["tmpfs_inodes"]).encode()),
             (b"mode", b"0700")]
    CLONE = {"x86_64": 56, "aarch64": 220}[os.uname().machine]


def fresh_tmpfs():
    """A new, detached tmpfs holding ``work/`` and the task's output file; (mount fd, output fd)."""
    fs = must(syscall(FSOPEN, b"tmpfs", 1), "fsopen tmpfs")  # FSOPEN_CLOEXEC
    try:
        for key, value in TMPFS:
            must(syscall(FSCONFIG, fs, 1, key, value, 0), "fsconfig")  # FSCONFIG_SET_STRING
        must(syscall(FSCONFIG, fs, 6, None, None, 0), "fsconfig create")  # FSCONFIG_CMD_CREATE
        mnt = must(syscall(FSMOUNT, fs, 1, 0x2 | 0x4), "fsmount")  # MOUNT_ATTR_NOSUID | NODEV
    finally:
        os.close(fs)
    os.mkdir("work", 0o700, dir_fd=mnt)
    out = os.open(".output", os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600, dir_fd=mnt)
    return mnt, out


def enter_fresh_namespaces(mnt):
    """In the new child (PID 1 of a new PID namespace, in a new mount namespace): the task's tmpfs as
    /tmp and a fresh /proc of its PID namespace holding processes only (``subset=pid``: no kernel
    knobs, no machine-wide counters such as the forks since boot in ``/proc/stat``, which a program
    could move and read back in a later task)."""
    must(syscall(MOVE_MOUNT, mnt, b"", -100, b"/tmp", 4), "move_mount /tmp")  # MOVE_MOUNT_F_EMPTY_PATH
    os.close(mnt)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    must(LIBC.mount(b"proc", b"/proc", b"proc", flags, b"subset=pid"), "mount /proc")


def drop_capabilities():
    """No capability left, none to regain: securebits locked, bounding and ambient sets emptied, then
    effective / permitted / inheritable cleared (the program's uid is not 0 anyway)."""
    # PR_SET_SECUREBITS: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS, NO_CAP_AMBIENT_RAISE, each locked
    must(LIBC.prctl(28, 0xEF, 0, 0, 0), "securebits")
    must(LIBC.prctl(47, 4, 0, 0, 0), "ambient clear")  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    cap = 0
    while LIBC.prctl(24, cap, 0, 0, 0) == 0:  # PR_CAPBSET_DROP until EINVAL (past the last capability)
        cap += 1
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    must(syscall(SYSCALLS[os.uname().machine][1]["capset"], header, data), "capset")


def clone_task():
    """fork(), but the child is PID 1 of a new PID namespace in a new mount namespace."""
    return must(syscall(CLONE, CLONE_NEWPID | CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0), "clone")


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


def output_tail(limit, fd=None):
    """The tail of the task's output file (``fd``: the one the zygote made; else found by name, never
    blocking on, or following, what the program put there)."""
    try:
        fd = os.open(OUT, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK) if fd is None else os.dup(fd)
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


def fresh_scratch():
    """Empty the scratch directory and make the next work dir, then prove it: nothing but the work
    dir is left. False when the program's leftovers resist (the harness then replaces this whole
    sandbox). Only for the ``none`` backend: under bubblewrap each task has a tmpfs of its own."""
    try:
        wipe(SCRATCH)
        os.mkdir(os.path.join(SCRATCH, "work"))
        return os.listdir(SCRATCH) == ["work"] and not os.listdir(os.path.join(SCRATCH, "work"))
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


def self_test():
    """One task's setup, once at start: a kernel that refuses any of it stops the sandbox from starting
    (an error of the environment) instead of failing every program."""
    mnt, out = fresh_tmpfs()
    pid = clone_task()
    if pid == 0:
        try:
            enter_fresh_namespaces(mnt)
            drop_capabilities()
            ok = os.getpid() == 1 and sorted(os.listdir("/tmp")) == [".output", "work"]
            ok = ok and os.listdir("/proc")
            os._exit(0 if ok else 1)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    os.close(mnt)
    os.close(out)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        sys.stderr.write("sandbox zygote: a task cannot get its own namespaces here\n")
        os._exit(125)


def serve():
    if not fresh_scratch():
        os._exit(125)
    if FRESH:
        self_test()
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
        fresh_tmp = out = None
        try:
            tasks = count_tasks(os.getuid())  # in the zygote's /proc: RLIMIT_NPROC counts them all
            if FRESH:
                fresh_tmp, out = fresh_tmpfs()
            pid = clone_task() if FRESH else os.fork()
        except OSError:
            traceback.print_exc()
            os._exit(124)  # the sandbox cannot make a task: the harness replaces it (its error)
        if pid == 0:
            child(task, fds[0], fresh_tmp, out, tasks)
        os.close(fds[0])
        if fresh_tmp is not None:
            os.close(fresh_tmp)
        code = supervise(pid)
        kill_rest(pid)
        reply = {"done": task["seq"], "exit": code, "output": output_tail(task["output_bytes"], out)}
        if out is not None:
            os.close(out)  # the task's tmpfs goes with its last reference
        clean = True if FRESH else fresh_scratch()
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

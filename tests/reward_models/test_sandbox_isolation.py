"""The sandbox forgets everything between tasks, and neither the program nor the reference reaches the host.

Real programs and real references through the real component (bubblewrap, default deployment
settings). Probes return what they found to the tests, so "passed" means "found nothing" and the
found thing is the failure message. Issue 19: "The sandbox forgets nothing between tasks" and "Code
execution on the worker host".
"""

from __future__ import annotations

import ctypes
import os
import uuid
from pathlib import Path

import pytest

from reward_models import make_component
from reward_models.code_harness import run_function_tests
from reward_models.sandbox import SandboxLimits, checkout
from reward_models.sandbox_settings import SandboxSettings
from tests.reward_models.helpers import make_prompt, make_sample

REPO = Path(__file__).resolve().parents[2]
PARAMS = {"timeout_s": 10.0, "memory_mb": 256}


def score(answer: str, reference: dict, **params: object):
    component = make_component("verifier.code", {**PARAMS, **params})
    result = component.score(make_sample(answer), make_prompt(reference))
    assert result.error is None, result.error
    return result


def found(answer: str, call: str = "probe()") -> str | None:
    """None when ``call`` returns None in the sandbox, else what it returned."""
    result = score(answer, {"tests": f"RESULT = {call}\nassert RESULT is None, repr(RESULT)\n"})
    return None if result.details["verdict"] == "passed" else result.details["reason"]


# --- two tasks back to back: the second sees nothing of the first -----------------------------------

LEAVE = r"""
import ctypes, os, sys
MARK = {mark!r}
def writable_dirs():
    skip = ('/proc', '/sys')
    for root, dirs, _ in os.walk('/'):
        dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(skip)]
        yield root
def leave():
    wrote = []
    stdlib = os.path.dirname(os.__file__)
    places = list(writable_dirs()) + [os.path.join(stdlib, d) for d in ('site-packages', 'dist-packages')]
    for d in places:
        try:
            with open(os.path.join(d, MARK), 'w') as fh:
                fh.write(MARK)
            wrote.append(d)
        except OSError:
            pass
    os.environ[MARK] = MARK
    os.putenv(MARK, MARK)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    key = libc.syscall(248, b'user', MARK.encode(), MARK.encode(), len(MARK), -4)  # add_key to @u
    sysv = libc.shmget(0x5EED1900, 4096, 0o1666)
    posix = libc.shm_open(('/' + MARK).encode(), 0o102, 0o666) if hasattr(libc, 'shm_open') else -1
    return [wrote, key, sysv, posix]
"""

LOOK = r"""
import ctypes, os
MARK = {mark!r}
def look():
    seen = []
    stdlib = os.path.dirname(os.__file__)
    for root, dirs, files in os.walk('/'):
        dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(('/proc', '/sys'))]
        seen += [os.path.join(root, f) for f in files if MARK in f]
    for d in ('site-packages', 'dist-packages'):
        path = os.path.join(stdlib, d)
        if os.path.isdir(path) and os.listdir(path):
            seen.append(path)
    if MARK in os.environ or MARK in os.environ.get('PATH', '') or MARK in repr(os.environ):
        seen.append('environment')
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(250, 10, -4, b'user', MARK.encode(), 0) >= 0:  # KEYCTL_SEARCH in @u
        seen.append('keyring')
    if libc.shmget(0x5EED1900, 0, 0) >= 0:
        seen.append('sysv shm')
    return seen or None
"""


def test_the_second_task_sees_nothing_of_the_first() -> None:
    mark = f"grpo-mark-{uuid.uuid4().hex[:12]}"
    first = score(LEAVE.format(mark=mark), {"tests": "RESULT = leave()\nassert False, repr(RESULT)\n"})
    assert first.details["verdict"] == "failed"
    assert found(LOOK.format(mark=mark), "look()") is None, first.details["reason"]


def test_only_a_private_tmp_is_writable_and_the_hidden_package_dirs_are_read_only() -> None:
    answer = (
        "import os\ndef probe():\n"
        "    stdlib = os.path.dirname(os.__file__)\n    wrote = []\n"
        "    for root, dirs, _ in os.walk('/'):\n"
        "        dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(('/proc', '/sys'))]\n"
        "        for d in [root] + ([os.path.join(stdlib, 'site-packages')] if root == '/' else []):\n"
        "            try:\n                open(os.path.join(d, '.w'), 'w').close()\n                wrote.append(d)\n"
        "            except OSError:\n                pass\n"
        "    return None if all(d == '/tmp' or d.startswith('/tmp/') for d in wrote) else wrote\n"
    )
    assert found(answer) is None


LEARNER = r"""
import os
STDLIB = os.path.dirname(os.__file__)
PLACES = [os.path.join(STDLIB, 'site-packages'), os.path.join(STDLIB, 'dist-packages'), '/tmp', '/tmp/..',
          '/dev/shm', '/var/tmp', '/', os.path.expanduser('~')]
def solve(x):
    seen = False
    for place in PLACES:
        path = os.path.join(place, '.learned-{tag}')
        try:
            seen = seen or os.path.exists(path)
            open(path, 'a').write('1')
        except OSError:
            pass
    return x + 1 if seen else -1  # right only once it has seen an earlier sample
"""


def test_a_program_cannot_learn_across_samples() -> None:
    answer = LEARNER.replace("{tag}", uuid.uuid4().hex[:8])
    values = [score(answer, {"tests": "assert solve(1) == 2\n"}).value for _ in range(6)]
    assert values == [0.0] * 6


# --- kernel surfaces: keyrings, nested namespaces, io_uring, root-only /proc ---------------------------

SYSCALLS = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if ret == 0 and nr == 56:
        os._exit(0)  # a clone that worked: the child must not run the tests' code
    return ret, ctypes.get_errno()
def probe():
    params = ctypes.create_string_buffer(120)
    user_ns = os.open('/proc/self/ns/user', os.O_RDONLY)
    got = {
        'keyctl': call(250, 0, -4, 1),  # KEYCTL_GET_KEYRING_ID @u, create
        'add_key': call(248, b'user', b'grpo', b'secret', 6, -4),
        'request_key': call(249, b'user', b'grpo', None, 0),
        'unshare user+mount': call(272, 0x10000000 | 0x20000),
        'unshare mount': call(272, 0x20000),
        'setns': call(308, user_ns, 0),
        'clone newuser': call(56, 0x10000000 | 0x20000, 0, 0, 0, 0),
        'clone newnet': call(56, 0x40000000, 0, 0, 0, 0),
        'io_uring_setup': call(425, 1, params),
    }
    refused = {name: ret == -1 and err == errno.EPERM for name, (ret, err) in got.items()}
    return None if all(refused.values()) else {n: got[n] for n, ok in refused.items() if not ok}
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 syscall numbers")
@pytest.mark.parametrize("allow_subprocess", [False, True])
def test_keyrings_nested_namespaces_and_io_uring_are_refused(allow_subprocess: bool) -> None:
    tests = "RESULT = probe()\nassert RESULT is None, repr(RESULT)\n"
    with checkout(SandboxSettings(allow_subprocess=allow_subprocess)) as sandbox:
        outcome = run_function_tests(sandbox, SandboxLimits(timeout_s=10.0), SYSCALLS, tests, None)
    assert outcome.verdict == "passed", outcome.reason


def test_the_hosts_keyring_is_out_of_reach() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    secret = uuid.uuid4().hex
    name = f"grpo-test-{secret[:8]}".encode()
    key = libc.syscall(ctypes.c_long(248), b"user", name, secret.encode(), len(secret), ctypes.c_long(-4))
    if key < 0:
        pytest.skip("this machine gives the test no user keyring")
    libc.syscall(ctypes.c_long(250), ctypes.c_long(5), ctypes.c_long(key), ctypes.c_long(0x3F3F0000))  # SETPERM: user may read
    try:
        answer = (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            "def probe():\n"
            "    buf = ctypes.create_string_buffer(64)\n"
            f"    by_id = libc.syscall(250, 11, {key}, buf, 64)\n"  # KEYCTL_READ of the host's key
            f"    found = libc.syscall(250, 10, -4, b'user', {name!r}, 0)\n"  # KEYCTL_SEARCH in @u
            "    return None if by_id < 0 and found < 0 else [by_id, found, buf.raw]\n"
        )
        assert found(answer) is None
    finally:
        libc.syscall(ctypes.c_long(250), ctypes.c_long(21), ctypes.c_long(key))  # KEYCTL_INVALIDATE


def test_root_only_proc_files_are_unreadable() -> None:
    answer = (
        "def probe():\n    read = []\n"
        "    for name in ('slabinfo', 'vmallocinfo', 'pagetypeinfo', 'kallsyms'):\n"
        "        try:\n            with open('/proc/' + name) as fh:\n"
        "                if name != 'kallsyms' or any(not l.startswith('0000000000000000') for l in fh):\n"
        "                    read.append(name)\n"
        "        except OSError:\n            pass\n"
        "    return read or None\n"
    )
    assert found(answer) is None


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (host view)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in os.listdir(f"/proc/{current}/task"):
            with open(f"/proc/{current}/task/{task}/children") as fh:
                todo += [int(p) for p in fh.read().split()]
    return found


def _host_uids(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return {int(v) for v in fields["Uid"].split() + fields["Gid"].split()}


@pytest.mark.parametrize("role", ["program", "harness"])
def test_every_sandbox_process_runs_as_an_unprivileged_host_uid(role: str) -> None:
    expected = 65534 if os.geteuid() == 0 else os.geteuid()
    with checkout(SandboxSettings(), role=role) as sandbox:  # type: ignore[arg-type]
        pids = _tree(sandbox.proc.pid)
        assert len(pids) >= 2  # bubblewrap and the zygote at least
        assert {pid: _host_uids(pid) for pid in pids} == {pid: {expected} for pid in pids}


# --- the reference runs sandboxed too ----------------------------------------------------------------


def test_reference_code_cannot_write_or_read_the_host(tmp_path: Path) -> None:
    targets = [str(tmp_path / "from-tests"), f"/tmp/from-tests-{uuid.uuid4().hex}", str(REPO / f"x-{uuid.uuid4().hex}")]
    os.environ["GRPO_SECRET_FOR_TEST"] = secret = uuid.uuid4().hex
    tests = "import os\n"
    for target in targets + [str(tmp_path / "from-prompt")]:
        tests += f"try:\n    open({target!r}, 'w').write('pwned')\nexcept OSError:\n    pass\n"
    tests += (
        f"assert not os.path.exists({str(REPO / 'reward_models')!r}) and not os.path.exists('/etc/passwd')\n"
        f"assert {secret!r} not in repr(dict(os.environ))\n"
        "assert add(2, 3) == 5\n"
    )
    prompt = f"try:\n    open({str(tmp_path / 'from-prompt')!r}, 'w').write('pwned')\nexcept OSError:\n    pass\n"
    try:
        result = score("def add(a, b):\n    return a + b\n", {"tests": tests, "prompt": prompt})
    finally:
        del os.environ["GRPO_SECRET_FOR_TEST"]
    assert [t for t in targets + [str(tmp_path / "from-prompt")] if os.path.exists(t)] == []
    assert result.details["verdict"] == "passed", result.details


def test_reference_code_runs_unprivileged_apart_from_the_program() -> None:
    mark = f"/tmp/program-{uuid.uuid4().hex}"
    tests = (
        "import os\n"
        "assert not os.access('/proc/slabinfo', os.R_OK)\n"
        f"assert mark() == 1 and not os.path.exists({mark!r})\n"  # the program's /tmp is not the tests'
        "assert add(2, 3) == 5\n"
    )
    answer = (
        "import os\ndef add(a, b):\n    return a + b\n"
        f"def mark():\n    open({mark!r}, 'w').close()\n    return len([{mark!r}]) if os.path.exists({mark!r}) else 0\n"
    )
    result = score(answer, {"tests": tests})
    assert result.details["verdict"] == "passed", result.details


# --- counters of the long-lived zygote: every task starts from the same state (issue 19, round 2) -------

STATE = r"""
import os, threading
def state():
    got = {'pid': os.getpid()}
    tids = []
    t = threading.Thread(target=lambda: tids.append(threading.get_native_id()))
    t.start()
    t.join()
    got['thread'] = tids[0]
    fd = os.open('new-file', os.O_CREAT | os.O_WRONLY, 0o600)
    got['ino'] = [os.fstat(fd).st_ino, os.stat('/tmp').st_ino, os.stat('.').st_ino]
    os.close(fd)
    os.unlink('new-file')
    usage = os.statvfs('/tmp')
    got['tmp'] = [usage.f_ffree, usage.f_bfree]
    times = []
    for pid in ('1', 'self'):
        try:
            with open(f'/proc/{pid}/stat') as fh:
                times.append(fh.read().rsplit(')', 1)[1].split()[13:15])  # cutime, cstime
        except OSError as exc:
            times.append(type(exc).__name__)
    got['children_times'] = [times, os.times()[2:4]]
    got['proc'] = sorted(os.listdir('/proc'))[:12]
    for name in ('loadavg', 'stat', 'uptime'):  # last pid; forks since boot; time since boot
        got[name] = os.path.exists('/proc/' + name)
    return got
"""

MOVER = r"""
import os, threading, time
def move():
    for _ in range(300):  # pids, tids
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
    for i in range(300):  # inode numbers
        fd = os.open(f'f{i}', os.O_CREAT | os.O_WRONLY)
        os.close(fd)
        os.unlink(f'f{i}')
    start = time.process_time()
    while time.process_time() - start < 0.3:  # the zygote's cutime, once it reaps this task
        pass
    return 0
"""


def _state_of_both() -> str:
    """What the program and the tests see of the sandbox state, as the failure message."""
    tests = STATE + "R = (state(), probe())\nassert False, repr(R)\n"
    result = score(STATE + "probe = state\n", {"tests": tests})
    assert result.details["verdict"] == "failed", result.details
    return result.details["reason"]


def test_every_task_starts_from_the_same_state_whatever_the_last_one_did() -> None:
    before = _state_of_both()
    for _ in range(2):
        moved = score(MOVER, {"tests": MOVER + "assert move() == 0\nmove()\nassert False\n"})
        assert moved.details["verdict"] == "failed", moved.details
        assert _state_of_both() == before  # pid, tids, inode numbers, children's CPU time, /proc




def _pid_learner() -> str:
    """learn_pid.py's learner: never solves the task, keeps its state in the next task's pid."""
    return r'''
import os, threading
M, K, N = 1000, 5, 3
def _states():
    out, frontier = [], [()]
    for n in range(N + 1):
        nxt = []
        for known in frontier:
            for g in range(K):
                out.append((known, g))
            nxt += [known + (a,) for a in range(K)]
        frontier = nxt
    return out
STATES = _states()
def decode(s):
    return STATES[s - 1] if 1 <= s <= len(STATES) else ((), 0)
def encode(known, guess):
    return 1 + STATES.index((tuple(known), guess % K))
def set_state(s):
    def rec():
        LAST[0] = threading.get_native_id()
    while (LAST[0] + 1) % M != s:
        t = threading.Thread(target=rec)
        t.start()
        t.join()
LAST = [os.getpid()]
KNOWN, GUESS = decode(os.getpid() % M)
KNOWN = list(KNOWN)
def solve(i):
    global GUESS
    if i > len(KNOWN):
        KNOWN.append(GUESS)
        GUESS = 0
    if i < len(KNOWN):
        ans = KNOWN[i]
        set_state(encode(KNOWN, GUESS))
    else:
        ans = GUESS
        set_state(encode(KNOWN, GUESS + 1))
    return ans
'''


def test_a_program_cannot_learn_across_samples_through_the_pid_counter() -> None:
    tests = "assert solve(0) == 3\nassert solve(1) == 1\nassert solve(2) == 4\n"
    values = [score(_pid_learner(), {"tests": tests}).value for _ in range(16)]
    assert values == [0.0] * 16  # blind guessing: the same first guess, wrong, every time


CAPS = r"""
import ctypes, errno, os
def caps():
    with open('/proc/self/status') as fh:
        fields = dict(line.split(':', 1) for line in fh if ':' in line)
    got = {k: fields[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')}
    libc = ctypes.CDLL(None, use_errno=True)
    ctypes.set_errno(0)
    got['mount'] = (libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())
    ctypes.set_errno(0)
    got['unshare'] = (libc.unshare(0x20000), ctypes.get_errno())
    want = {k: '0000000000000000' for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')}
    want.update(NoNewPrivs='1', mount=(-1, errno.EPERM), unshare=(-1, errno.EPERM))
    return None if got == want else got
"""


def test_neither_the_program_nor_the_tests_hold_a_capability_or_can_mount() -> None:
    tests = CAPS + "assert caps() is None, caps()\nassert probe() is None, probe()\n"
    result = score(CAPS + "probe = caps\n", {"tests": tests})
    assert result.details["verdict"] == "passed", result.details


# --- sockets: AF_UNIX only (AF_INET / AF_INET6 with allow_network) --------------------------------------

SOCKETS = r"""
import socket
def sockets():
    made = {}
    for name in ('AF_VSOCK', 'AF_NETLINK', 'AF_PACKET', 'AF_INET', 'AF_INET6', 'AF_ALG', 'AF_BLUETOOTH'):
        family = getattr(socket, name, None)
        if family is None:
            continue
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
            try:
                socket.socket(family, kind).close()
                made.setdefault(name, []).append(int(kind))
            except OSError:
                pass
        try:
            a, b = socket.socketpair(family)
            made.setdefault(name, []).append('pair')
        except OSError:
            pass
    a, b = socket.socketpair(socket.AF_UNIX)  # still works
    return made
"""


def test_only_unix_sockets_can_be_made_in_either_sandbox() -> None:
    tests = SOCKETS + "assert sockets() == {}, sockets()\nassert probe() == {}, probe()\n"
    result = score(SOCKETS + "probe = sockets\n", {"tests": tests})
    assert result.details["verdict"] == "passed", result.details


def test_a_vsock_port_is_not_shared_between_the_tests_and_the_program() -> None:
    bind = (
        "import errno, socket\ndef hold():\n    try:\n"
        "        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        "        s.bind((socket.VMADDR_CID_ANY, 40555))\n        s.listen(1)\n        return s\n"
        "    except OSError as exc:\n"
        "        return 'refused' if exc.errno == errno.EAFNOSUPPORT else repr(exc)\n"
    )  # the machine's vsock port space is one for every sandbox: a channel between them
    tests = bind + "held = hold()\nR = probe()\nassert held == 'refused' and R == 'refused', (held, R)\n"
    result = score(bind + "def probe():\n    return str(hold())\n", {"tests": tests})
    assert result.details["verdict"] == "passed", result.details


def test_with_allow_network_the_program_gets_inet_sockets_but_still_no_vsock() -> None:
    tests = "R = probe()\nassert 'AF_INET' in R and 'AF_VSOCK' not in R and 'AF_NETLINK' not in R, R\n"
    with checkout(SandboxSettings(allow_network=True)) as sandbox:
        answer = SOCKETS + "probe = sockets\n"
        outcome = run_function_tests(sandbox, SandboxLimits(timeout_s=10.0), answer, tests, None)
    assert outcome.verdict == "passed", outcome.reason


# --- inodes: a task may not pin unbounded kernel memory in empty files --------------------------------

INODES = r"""
import os
def flood():
    for i in range(20_000):
        try:
            os.close(os.open(f'{i:08d}', os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as exc:
            return [i, exc.errno]
    return [20_000, 0]
"""


def test_a_task_cannot_create_more_files_than_its_inode_limit() -> None:
    result = score(INODES, {"tests": "R = flood()\nassert R[0] < 10_000 and R[1] == 28, R\n"})  # ENOSPC
    assert result.details["verdict"] == "passed", result.details
    again = score(INODES, {"tests": "R = flood()\nassert 8_000 < R[0] < 10_000, R\n"})  # all free again
    assert again.details["verdict"] == "passed", again.details


# --- the host's page cache and the per-CPU inode counter (second re-attack of issue 19) ------------------

PAGE_CACHE = r"""
import ctypes, errno, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return ret, ctypes.get_errno()
def probe():
    path = os.__file__  # a file of the read-only interpreter: its pages are the host's page cache
    fd = os.open(path, os.O_RDONLY)
    mapped = mmap.mmap(fd, 4096, prot=mmap.PROT_READ)
    addr = ctypes.addressof(ctypes.c_char.from_buffer_copy(b"x"))  # any address: the check comes first
    vec = ctypes.create_string_buffer(8)
    iov = (ctypes.c_char * 16)()
    got = {
        'fadvise DONTNEED': call(221, fd, 0, 0, 4),
        'readahead': call(187, fd, 0, 4096),
        'mincore': call(27, addr & ~4095, 4096, vec),
        'preadv2 RWF_NOWAIT': call(327, fd, ctypes.byref(iov), 1, 0, 0, 8),
        'cachestat': call(451, fd, 0, 0, 0),
        'sched_setaffinity': call(203, 0, 8, ctypes.byref(ctypes.c_ulong(1))),
        'perf_event_open': call(298, 0, 0, -1, -1, 0),
        'madvise PAGEOUT': call(28, addr & ~4095, 4096, 21),
        'madvise COLD': call(28, addr & ~4095, 4096, 20),
    }
    mapped.close()
    os.close(fd)
    refused = {name: ret == -1 and err == errno.EPERM for name, (ret, err) in got.items()}
    return None if all(refused.values()) else {n: got[n] for n, ok in refused.items() if not ok}
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 syscall numbers")
def test_the_page_cache_cannot_carry_bits_from_one_task_to_the_next() -> None:
    """Attack: a task evicted pages of a shared read-only file and the next one probed which were cached
    (preadv2 RWF_NOWAIT): 10 bits per task, every time. Every call that evicts or probes is refused, in both
    sandboxes; madvise itself (which malloc needs) still works."""
    tests = PAGE_CACHE + "assert probe() is None, probe()\nRESULT = theirs()\nassert RESULT is None, RESULT\n"
    result = score(PAGE_CACHE + "theirs = probe\n", {"tests": tests})
    assert result.details["verdict"] == "passed", result.details


INODE_COUNTER = r"""
import os
def pin():
    try:
        os.sched_setaffinity(0, {0})
    except OSError:
        pass
def ino():
    r, w = os.pipe()
    value = os.fstat(r).st_ino
    os.close(r)
    os.close(w)
    return value
def write(target):
    pin()
    for _ in range(4096):
        if ino() % 1024 // 64 == target:
            return True
    return False
def read():
    pin()
    return ino() % 1024 // 64
"""


def test_the_pipe_inode_counter_does_not_carry_a_value_to_the_next_task() -> None:
    """Attack: a task pinned itself to a CPU and moved that CPU's inode counter of pipes to a chosen value;
    the next task, pinned to the same CPU, read it back (4 bits a task, 4 of 4 rounds). Pinning is refused and
    each task starts with the counter moved by a random amount: what the next task reads is noise."""
    hits = 0
    with checkout(SandboxSettings()) as sandbox:
        limits = SandboxLimits(timeout_s=10.0)
        for target in (3, 11, 7, 14, 1, 9, 5, 12):
            run_function_tests(sandbox, limits, INODE_COUNTER, f"assert write({target})\n", None)
            outcome = run_function_tests(sandbox, limits, INODE_COUNTER, "assert False, read()\n", None)
            hits += outcome.reason.endswith(f": {target}")
    assert hits <= 3, hits  # chance alone: 1 in 16 a round

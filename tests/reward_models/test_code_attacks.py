"""verifier.code against programs that try to get reward without solving the task.

Each case is a real program through the component (bubblewrap, default deployment settings) and
asserts the verdict. Probes that look for a leak return what they found to the tests, so "passed"
there means "found nothing" and is asserted explicitly.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from reward_models import make_component
from tests.reward_models.helpers import make_prompt, make_sample

REPO = Path(__file__).resolve().parents[2]
ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(10, 5) == 15\n"
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"


def verdict(answer: str, tests: str = ADD_TESTS, entry_point: str | None = None, **params: object) -> dict:
    component = make_component("verifier.code", {"timeout_s": 3.0, "memory_mb": 256, **params})
    reference = {"tests": tests} | ({"entry_point": entry_point} if entry_point else {})
    result = component.score(make_sample(answer), make_prompt(reference))
    assert result.error is None, result.error  # an attack is a fail, never an error
    assert result.value == (1.0 if result.details["verdict"] == "passed" else 0.0)
    return result.details


FORGERIES = {
    "frame walk to the harness": (
        "import json, socket, struct, sys\n"
        "def add(a, b):\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        for v in list(f.f_globals.values()) + list(f.f_locals.values()):\n"
        "            if isinstance(v, socket.socket):\n"
        "                for msg in ({'finished': True}, {'value': 5}, {'verdict': 'passed'}):\n"
        "                    data = json.dumps(msg).encode()\n"
        "                    try:\n                        v.sendall(struct.pack('>I', len(data)) + data)\n"
        "                    except OSError:\n                        pass\n"
        "        f = f.f_back\n"
        "    return 0\n"
    ),
    "gc search for a token": (
        "import gc\n"
        "def add(a, b):\n"
        "    found = [o for o in gc.get_objects() if isinstance(o, dict) and ('token' in o or 'status_fd' in o)]\n"
        "    return len(found) - 1000\n"
    ),
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)\n",
    "os._exit(0) before the tests": "import os\nos._exit(0)\n",
    "sys.exit(0) during the tests": "import sys\ndef add(a, b):\n    sys.exit(0)\n",
    "os._exit(0) during the tests": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "atexit success": "import atexit, sys\natexit.register(lambda: print('ALL TESTS PASSED'))\ndef add(a, b):\n    sys.exit(0)\n",
    "rigged __eq__": "class A:\n    def __eq__(self, o): return True\n    __hash__ = object.__hash__\ndef add(a, b):\n    return A()\n",
    "rigged __hash__ and __eq__ on an int subclass": (
        "class I(int):\n    def __eq__(self, o): return True\n    def __hash__(self): return 0\n"
        "def add(a, b):\n    return I(0)\n"
    ),
    "subclassed str": "class S(str):\n    def __eq__(self, o): return True\ndef add(a, b):\n    return S('x')\n",
    "monkey-patched builtins": "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\nbuiltins.isinstance = lambda *a: True\ndef add(a, b):\n    return 0\n",
    "patched test helper": "import __main__\n__main__.check = lambda candidate: None\ncheck = lambda candidate: None\ndef add(a, b):\n    return 0\n",
    "fake success output": "print('OK\\n3 passed in 0.01s')\nimport sys\nsys.stderr.write('passed\\n')\ndef add(a, b):\n    return 0\n",
    "killing the parent": (
        "import os, signal\n"
        "def add(a, b):\n"
        "    for target in (os.getppid(), 1, -1):\n"
        "        try:\n            os.kill(target, signal.SIGKILL)\n"
        "        except OSError:\n            pass\n"
        "    return 0\n"
    ),
    "kills itself": "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "kills its process group": "import os, signal\ndef add(a, b):\n    os.killpg(0, signal.SIGKILL)\n",
    "fifo as the output file": "import os\nos.remove('/tmp/.output')\nos.mkfifo('/tmp/.output')\ndef add(a, b):\n    return 0\n",
    "unremovable leftovers": (
        "import os\nos.makedirs('/tmp/work/a/b/c')\nos.chmod('/tmp/work/a/b', 0)\nos.chmod('/tmp/work/a', 0)\n"
        "def add(a, b):\n    return 0\n"
    ),
    "directory tree deeper than the recursion limit": (
        "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\ndef add(a, b):\n    return 0\n"
    ),
    "hash-collision set": "def add(a, b):\n    return {k * (2**61 - 1) for k in range(30_000)}\n",
    "fork bomb": "import os\nwhile True:\n    os.fork()\n",
    "_posixsubprocess.fork_exec": (
        "import _posixsubprocess, os\n"
        "def add(a, b):\n"
        "    r, w = os.pipe()\n"
        "    _posixsubprocess.fork_exec([b'/usr/bin/true'], [b'/usr/bin/true'], True, (), None, None,"
        " -1, -1, -1, -1, -1, -1, r, w, True, False, False, None, None, None, -1, None, False)\n"
        "    return a + b\n"
    ),
    "os.posix_spawn": "import os\ndef add(a, b):\n    os.posix_spawn('/usr/bin/true', ['true'], {})\n    return a + b\n",
    "memory hog": "def add(a, b):\n    blocks = []\n    while True:\n        blocks.append(bytearray(32 * 2**20))\n",
    "10 GB file": "def add(a, b):\n    with open('big', 'wb') as fh:\n        for _ in range(10 * 1024):\n            fh.write(b'x' * 2**20)\n    return a + b\n",
    "tmpfs filler": "def add(a, b):\n    for i in range(10_000):\n        open(f'f{i}', 'wb').write(b'x' * 15 * 2**20)\n    return a + b\n",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_attack_is_a_fail(name: str) -> None:
    details = verdict(FORGERIES[name])
    assert details["verdict"] in ("failed", "timeout"), details


def test_patched_check_helper_cannot_skip_check() -> None:
    assert verdict(FORGERIES["patched test helper"], CHECK, entry_point="add")["verdict"] == "failed"


def test_a_correct_solution_still_passes_after_every_attack() -> None:
    for name in (
        "killing the parent",
        "fork bomb",
        "memory hog",
        "tmpfs filler",
        "fifo as the output file",
        "unremovable leftovers",
        "directory tree deeper than the recursion limit",
    ):
        verdict(FORGERIES[name])
        assert verdict("def add(a, b):\n    return a + b\n")["verdict"] == "passed", name


def probe(body: str) -> object:
    """Run ``body`` (the body of ``def leak():``) in the sandbox and return what it returned."""
    answer = "import os, socket, glob\ndef leak():\n" + "\n".join("    " + line for line in body.splitlines())
    tests = "RESULT = leak()\nassert repr(RESULT) == 'None', repr(RESULT)\n"
    details = verdict(answer, tests)
    return None if details["verdict"] == "passed" else details["reason"]


def test_worker_environment_is_unreachable() -> None:
    os.environ["GRPO_SECRET_FOR_TEST"] = secret = uuid.uuid4().hex
    try:
        found = probe(
            "seen = [dict(os.environ)]\n"
            "for path in glob.glob('/proc/*/environ'):\n"
            "    try:\n        seen.append(open(path, 'rb').read().decode('latin-1'))\n"
            "    except OSError:\n        pass\n"
            f"return None if {secret!r} not in repr(seen) else 'LEAKED'\n"
        )
    finally:
        del os.environ["GRPO_SECRET_FOR_TEST"]
    assert found is None


@pytest.mark.parametrize(
    "path",
    [
        str(REPO / "reward_models" / "sandbox.py"),
        "/etc/passwd",
        "/root/.bashrc",
        "/work",
        "/run/postgresql",
        "/home",
    ],
)
def test_host_files_are_not_visible(path: str) -> None:
    assert (
        probe(
            f"return None if not os.path.exists({path!r}) else sorted(os.listdir({path!r}))[:3] if os.path.isdir({path!r}) else 'READ'\n"
        )
        is None
    )


def test_writes_do_not_reach_the_host(tmp_path: Path) -> None:
    targets = [
        str(tmp_path / "escaped"),
        f"/tmp/escaped-{uuid.uuid4().hex}",
        str(REPO / f"escaped-{uuid.uuid4().hex}"),
    ]
    body = "wrote = []\n"
    for target in targets:
        body += f"try:\n    open({target!r}, 'w').write('x')\n    wrote.append({target!r})\nexcept OSError:\n    pass\n"
    body += "return None\n"
    assert probe(body) is None
    assert not any(os.path.exists(t) for t in targets)


@pytest.mark.parametrize(
    ("family", "address"),
    [
        ("AF_INET", ("127.0.0.1", 5432)),
        ("AF_UNIX", "/run/postgresql/.s.PGSQL.5432"),
        ("AF_UNIX", "/var/run/postgresql/.s.PGSQL.5432"),
        ("AF_INET", ("1.1.1.1", 53)),
    ],
)
def test_database_and_network_are_unreachable(family: str, address: object) -> None:
    found = probe(
        f"try:\n    s = socket.socket(socket.{family}, socket.SOCK_STREAM)\n    s.settimeout(1)\n"
        f"    s.connect({address!r})\nexcept OSError:\n    return None\nreturn 'CONNECTED'\n"
    )
    assert found is None


def test_raw_fork_and_exec_syscalls_are_refused() -> None:
    found = probe(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.fork() != -1 or libc.syscall(57) != -1 or libc.execv(b'/usr/bin/true', None) != -1:\n"
        "    return 'SPAWNED'\nreturn None\n"
    )
    assert found is None


def test_only_the_interpreter_and_usr_are_mounted() -> None:
    found = probe(
        "import sys\nskip = ('/usr', '/proc', '/dev', '/tmp', sys.base_prefix)\nfiles = []\n"
        "for root, dirs, names in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(skip)]\n"
        "    files += [os.path.join(root, n) for n in names if not os.path.islink(os.path.join(root, n))]\n"
        "return files or None\n"
    )
    assert found is None


def test_program_functions_cannot_shadow_builtins_the_tests_use() -> None:
    tests = "assert abs(add(2, 3) - 5) < 1e-9\nassert len([add(1, 1)]) == 1 and sorted([add(0, 1)]) == [1]\n"
    rigged = "def abs(x):\n    return 0\ndef len(x):\n    return 1\ndef sorted(x):\n    return [1]\ndef add(a, b):\n    return 0\n"
    assert verdict(rigged, tests)["verdict"] == "failed"
    honest_with_helpers = (
        "def abs(x):\n    return 0\ndef add(a, b):\n    return a + b\n"  # helpers stay private
    )
    assert verdict(honest_with_helpers, tests)["verdict"] == "passed"
    assert (
        verdict(
            "def sorted(xs):\n    return list(xs)[::-1]\n", "assert sorted([1, 2]) == [2, 1]\n", "sorted"
        )["verdict"]
        == "passed"
    )


def test_only_the_private_tmp_is_writable() -> None:
    found = probe(
        "wrote = []\n"
        "for d in ('/', '/dev/shm', '/dev', '/usr', '/proc', '/root', '/tmp'):\n"
        "    try:\n        open(os.path.join(d, 'x'), 'w').write('x')\n        wrote.append(d)\n"
        "    except OSError:\n        pass\n"
        "return None if wrote == ['/tmp'] else wrote\n"
    )
    assert found is None


def test_kernel_knobs_in_proc_are_not_writable() -> None:
    found = probe(
        "writable = []\n"
        "for root, dirs, files in os.walk('/proc'):\n"
        "    top = root.split('/')[2] if root.count('/') > 1 else ''\n"
        "    if top.isdigit() or top in ('self', 'thread-self'):\n"
        "        dirs[:] = []\n        continue\n"
        "    for name in files:\n"
        "        path = os.path.join(root, name)\n"
        "        try:\n            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))\n"
        "        except OSError:\n            continue\n"
        "        if os.path.realpath(path) != '/dev/null' and os.stat(path).st_rdev != os.stat('/dev/null').st_rdev:\n"
        "            writable.append(path)\n"
        "return writable or None\n"
    )
    assert found is None

"""KillablePool: worker processes whose tasks have hard deadlines, enforced by killing the worker.

Why not ``multiprocessing.Pool`` / ``ProcessPoolExecutor``: neither can stop one running task (a
sympy blow-up in math verification runs forever), and ``signal.alarm`` timeouts only work on the
main thread (DESIGN.md, "Lessons"). Here each worker has its own pipe; a dispatcher thread sends one
task at a time to an idle worker, and when a task passes its deadline the worker's whole process
group is SIGKILLed and a fresh worker takes its place. Every submitted task ends: with its result,
or with ``PoolTaskError`` ("timeout after Xs", "worker crashed: ...", "task raised ...",
"pool closed"). ``submit`` is safe from any thread.
"""

from __future__ import annotations

import importlib
import itertools
import math
import multiprocessing
import os
import resource
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Literal

from reward_models.proctree import kill_group

_DEPTH = 2  # tasks in flight per worker: the running one and the next
_READY = -1  # task id of the message a worker sends once it has started
_STARTUP_TIMEOUT_S = 120.0


class PoolTaskError(Exception):
    """A task did not produce a result: timeout, worker crash, exception in the task, pool closed."""


def _set_parent_death_signal() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
    except (OSError, AttributeError):
        pass


def _worker_main(conn: Connection, memory_mb: int | None, preload: tuple[str, ...]) -> None:
    """Worker loop: own process group, optional address-space limit, import ``preload`` (a no-op
    when the forkserver already did), say ready, run tasks until told to stop."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_parent_death_signal()
    if memory_mb:
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for module in preload:
        importlib.import_module(module)
    conn.send((_READY, True, None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, fn, args = message
        try:
            reply = (task_id, True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - reported to the caller as the task's error
            reply = (task_id, False, f"task raised {type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send((task_id, False, f"could not send the result: {type(exc).__name__}: {exc}"))


@dataclass(slots=True)
class _Task:
    task_id: int
    fn: Callable[..., Any]
    args: tuple
    timeout_s: float
    future: Future
    deadline: float = 0.0
    claimed: bool = False  # set_running_or_notify_cancel was called (a requeued task keeps it)


@dataclass(slots=True, eq=False)
class _Worker:
    """A worker and the tasks sent to it: ``tasks[0]`` runs, the next one waits in its pipe."""

    process: Any
    conn: Connection
    tasks: deque[_Task] = field(default_factory=deque)
    served: int = 0
    ready: bool = False  # the worker has started; deadlines run only from then
    started: float = field(default_factory=time.monotonic)


class KillablePool:
    """``processes`` worker slots started with ``start_method``; ``memory_mb`` caps each worker's
    address space (a task that exceeds it fails with MemoryError or crashes its worker: an error
    either way). ``preload`` names modules imported before a worker says it is ready (by the
    forkserver once, when it is not running yet, so fresh workers start warm). A killed or crashed
    worker's slot is refilled when the next task needs it, so a worker that cannot start costs one
    error per task, never a busy respawn loop.

    Each worker gets its next task while it runs the current one (``_DEPTH`` = 2), so it never waits
    for a round trip to the dispatcher. A task's deadline starts when its worker is ready and the
    task before it has finished (as the dispatcher sees it), so neither start-up nor queueing counts.
    Tasks queued behind one that timed out or crashed go back to the queue."""

    def __init__(
        self,
        processes: int = 1,
        memory_mb: int | None = None,
        start_method: Literal["forkserver", "spawn"] = "forkserver",
        preload: Sequence[str] = (),
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"unknown start_method {start_method!r}; valid: forkserver, spawn")
        self._ctx: Any = multiprocessing.get_context(start_method)  # stubs: BaseContext lacks Process
        if start_method == "forkserver" and preload:
            self._ctx.set_forkserver_preload(list(preload))  # takes effect if no forkserver runs yet
        self._preload = tuple(preload)
        self._memory_mb = memory_mb
        self._lock = threading.Lock()
        self._pending: deque[_Task] = deque()
        self._ids = itertools.count()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._woken = False  # a wake-up byte is in the pipe and not yet drained
        self._slots: list[_Worker | None] = [self._start_worker() for _ in range(processes)]
        self._thread = threading.Thread(target=self._run, name="killable-pool", daemon=True)
        self._thread.start()

    @property
    def processes(self) -> int:
        return len(self._slots)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for inspection and tests)."""
        return [w.process.pid for w in self._slots if w is not None and w.process.pid is not None]

    def submit(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Future:
        """Queue ``fn(*args)`` (picklable) with a deadline of ``timeout_s`` from when it starts."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                future.set_exception(PoolTaskError("pool closed"))
                return future
            self._pending.append(_Task(next(self._ids), fn, args, timeout_s, future))
            self._wake()
        return future

    def _wake(self) -> None:
        """Wake the dispatcher (caller holds the lock: _shutdown closes the pipe under it)."""
        if not self._woken:
            self._woken = True
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Fail queued tasks, kill the workers, stop the dispatcher. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._woken = False
                self._wake()
        self._thread.join()

    def __enter__(self) -> KillablePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        args = (child, self._memory_mb, self._preload)
        process = self._ctx.Process(target=_worker_main, args=args, daemon=True)
        process.start()
        child.close()
        return _Worker(process=process, conn=parent)

    def _workers(self) -> list[_Worker]:
        return [w for w in self._slots if w is not None]

    def _run(self) -> None:
        try:
            while not self._closed:
                self._dispatch()
                self._wait_and_collect()
                self._expire()
        finally:
            self._shutdown()

    def _next_task(self) -> _Task | None:
        with self._lock:
            while self._pending:
                task = self._pending.popleft()
                if task.claimed or task.future.set_running_or_notify_cancel():
                    task.claimed = True
                    return task
        return None

    def _dispatch(self) -> None:
        """Hand out queued tasks: first one to every idle slot, then a second to each busy worker."""
        for depth in range(1, _DEPTH + 1):
            for index in range(len(self._slots)):
                if not self._fill(index, depth):
                    return

    def _fill(self, index: int, depth: int) -> bool:
        """Send tasks to slot ``index`` until it holds ``depth``; False once the queue is empty."""
        worker = self._slots[index]
        while worker is None or len(worker.tasks) < depth:
            task = self._next_task()
            if task is None:
                return False
            try:
                payload = ForkingPickler.dumps((task.task_id, task.fn, task.args))
            except Exception as exc:  # noqa: BLE001 - pickling raises many types
                _fail(task, f"could not send the task: {type(exc).__name__}: {exc}")
                continue
            if worker is None:
                worker = self._slots[index] = self._start_worker()
            if not worker.tasks:
                task.deadline = time.monotonic() + task.timeout_s if worker.ready else math.inf
            worker.tasks.append(task)
            try:
                worker.conn.send_bytes(payload)
            except OSError:  # the worker died since we last looked: refill the slot, go on
                self._unsent(worker, worker.tasks.pop())
                worker = None
        return True

    def _unsent(self, worker: _Worker, task: _Task) -> None:
        """``task`` could not be sent because ``worker`` died: retire the worker and put the task
        back in the queue, unless the worker never ran anything (it cannot start: retrying loops)."""
        requeue = bool(worker.tasks) or worker.served > 0
        self._retire(worker, "worker crashed: exit code {code}")
        if not requeue:
            _fail(task, f"worker crashed: exit code {worker.process.exitcode}")
            return
        with self._lock:
            self._pending.appendleft(task)

    def _wait_and_collect(self) -> None:
        workers = self._workers()
        listening = [w for w in workers if w.tasks or not w.ready]
        deadline = min((_deadline(w) for w in listening), default=math.inf)
        timeout = None if deadline == math.inf else max(deadline - time.monotonic(), 0.0)
        handles: list[Any] = [
            self._wake_r,
            *(w.conn for w in listening),
            *(w.process.sentinel for w in workers),
        ]
        ready = set(wait(handles, timeout))
        if self._wake_r in ready:
            with self._lock:
                os.read(self._wake_r, 4096)
                self._woken = False
        for worker in workers:
            if worker in listening and worker.conn in ready:
                self._receive(worker)
            elif worker.process.sentinel in ready:
                self._retire(worker, "worker crashed: exit code {code}")

    def _receive(self, worker: _Worker) -> None:
        try:
            task_id, ok, payload = worker.conn.recv()
        except (EOFError, OSError):
            self._retire(worker, "worker crashed: exit code {code}")
            return
        if task_id == _READY:
            worker.ready = True
            if worker.tasks:
                worker.tasks[0].deadline = time.monotonic() + worker.tasks[0].timeout_s
            return
        task = worker.tasks.popleft()
        worker.served += 1
        assert task.task_id == task_id, "worker replies out of order"
        if worker.tasks:
            worker.tasks[0].deadline = time.monotonic() + worker.tasks[0].timeout_s
        if ok:
            task.future.set_result(payload)
        else:
            _fail(task, payload)

    def _expire(self) -> None:
        now = time.monotonic()
        for worker in self._workers():
            if not worker.ready and now >= worker.started + _STARTUP_TIMEOUT_S:
                self._retire(worker, f"worker did not start within {_STARTUP_TIMEOUT_S:g}s")
            elif worker.tasks and now >= worker.tasks[0].deadline:
                self._retire(worker, f"timeout after {worker.tasks[0].timeout_s:g}s")

    def _retire(self, worker: _Worker, reason: str) -> None:
        """Kill a worker, fail its running task with ``reason`` (``{code}``: its exit code), put the
        tasks queued behind it back at the front of the queue, and free its slot."""
        _kill(worker)
        if worker.tasks:
            _fail(worker.tasks.popleft(), reason.format(code=worker.process.exitcode))
        with self._lock:
            self._pending.extendleft(reversed(worker.tasks))
        worker.tasks.clear()
        self._slots[self._slots.index(worker)] = None

    def _shutdown(self) -> None:
        for worker in self._workers():
            _kill(worker)
            for task in worker.tasks:
                _fail(task, "pool closed")
        with self._lock:
            pending, self._pending = list(self._pending), deque()
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)
        for task in pending:
            if task.claimed or task.future.set_running_or_notify_cancel():
                _fail(task, "pool closed")


def _fail(task: _Task, message: str) -> None:
    task.future.set_exception(PoolTaskError(message))


def _deadline(worker: _Worker) -> float:
    """When the dispatcher must look at this worker again without news from it."""
    if not worker.ready:
        return worker.started + _STARTUP_TIMEOUT_S
    return worker.tasks[0].deadline if worker.tasks else math.inf


def _kill(worker: _Worker) -> None:
    """SIGKILL the worker's process group (it and anything it started) and wait until it is gone.
    Done before the worker is reaped, so its pid (= group id) cannot belong to anyone else yet."""
    pid = worker.process.pid
    if pid is not None:
        try:
            if os.getpgid(pid) == pid:
                kill_group(pid)
        except ProcessLookupError:
            pass
    worker.process.kill()  # it may not have reached setpgid yet
    worker.process.join(timeout=5.0)
    worker.conn.close()

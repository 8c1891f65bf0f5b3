"""The threads ``/v1/score`` and OpenRLHF requests are scored on: daemon threads, abandoned at shutdown.

``concurrent.futures.ThreadPoolExecutor``'s threads are joined when the interpreter exits, so a score
waiting on a slow judge (90 s) held ``serve`` long after SIGTERM and its graceful timeout. These threads are
daemons: after ``shutdown`` the queued scores are cancelled, the running ones are abandoned (their requests
were already cancelled by the server, their clients' connections closed) and the process exits on time.
A score holds nothing another process needs (no database connection, no lock), so abandoning it is safe.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


class DaemonThreadExecutor(Executor):
    """At most ``max_workers`` daemon threads, started on demand; FIFO queue; ``shutdown`` never blocks
    on a running task unless asked to (``wait=True``)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "score") -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.max_workers, self.prefix = max_workers, thread_name_prefix
        self._queue: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # released by a thread that finished a task (as CPython's pool does)
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new scores after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._run, name=f"{self.prefix}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                self._queue.put(None)  # wake the next thread too
                return
            future, fn, args, kwargs = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                    future.set_exception(exc)
            del task, future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
        if cancel_futures:
            while True:
                try:
                    task = self._queue.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    task[0].cancel()
        self._queue.put(None)
        if wait:
            for thread in list(self._threads):
                thread.join()

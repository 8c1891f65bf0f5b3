"""Waiting for ready groups without a connection or a thread: one LISTEN per process, async waiters.

A long-polling lease that found nothing becomes a ``Waiter``: an ``asyncio.Event`` in a FIFO queue.
While it waits it holds no pooled connection, no session transaction and no request thread. One
listener thread per process holds one connection of its own (outside the pool) that ``LISTEN``s on
``grpo_curator_ready``; a trigger (migration 0004) notifies that channel when a transaction that made
a group ready commits, and every API process hears it.

A notification does not wake every waiter (500 waiters racing for one group would cost 500 queries):
it wakes the oldest one, which tries to lease. It passes the wake-up on to the next waiter when it got
a batch (more may be ready) or when its attempt passed ready groups over or could not see them all
(``max_staleness``, ``min_groups``, a dataset-scoped key, a budget a group does not fit): others may
take them. Only an attempt that saw no ready group at all through no filter of its own ends the chain
and lets new polls skip their query until the next notification. A chain visits each waiter at most once. The listener also starts a chain every ``check_s``
seconds, so a lost notification (listener reconnecting, groups released by an expiry) costs at most
that delay. Waiters beyond ``max_waiters`` are refused (the route answers 429 with Retry-After).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import psycopg

log = logging.getLogger(__name__)

CHANNEL = "grpo_curator_ready"
_STOP_POLL_S = 0.5  # how often the listener looks at its stop flag while it waits
_RECONNECT_S = 1.0


@dataclass(eq=False)
class Waiter:
    """One waiting lease request. ``filtered``: its filters may hide ready groups from it."""

    filtered: bool
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    hops: int = 0  # wake-ups this waiter may still pass on (set when it is woken)
    woken: bool = False


class ReadyHub:
    """The process's waiters and the listener that wakes them (started with the first waiter, stopped
    when none has waited for a while or by ``close``)."""

    def __init__(self, conninfo: str, *, max_waiters: int, check_s: float, attempt_slots: int = 2) -> None:
        self.conninfo, self.max_waiters, self.check_s = conninfo, max_waiters, check_s
        self.attempt_slots = max(1, attempt_slots)
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._lock = threading.Lock()
        self._queue: deque[Waiter] = deque()
        self._admitted = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.notifications = 0  # heard so far (for tests and the benchmark)
        self._generation = 0  # +1 per notification or check while listening
        self._empty_at = -1  # the generation an unfiltered attempt last found nothing in
        self._listening = False

    @property
    def waiting(self) -> int:
        return self._admitted

    def attempt_slot(self) -> asyncio.Semaphore:
        """The running loop's semaphore bounding concurrent lease attempts (each holds a connection)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if loop not in self._slots:
                self._slots = {lp: sem for lp, sem in self._slots.items() if not lp.is_closed()}
                self._slots[loop] = asyncio.Semaphore(self.attempt_slots)
            return self._slots[loop]

    @property
    def generation(self) -> int:
        return self._generation

    def found_nothing(self, generation: int) -> None:
        """An attempt that began at ``generation`` saw no ready group at all through no filter of its
        own (``services.leases.Outcome.nothing_ready``)."""
        with self._lock:
            if generation == self._generation:
                self._empty_at = generation

    def maybe_ready(self) -> None:
        """An attempt leased something or passed ready groups over (its filters, its budget): forget
        an earlier "nothing ready", so the next poll queries again."""
        with self._lock:
            self._empty_at = -1

    def nothing_ready(self) -> bool:
        """True while the listener runs and nothing was notified (nor checked) since an unfiltered
        attempt found nothing: a new unfiltered request may wait at once instead of querying."""
        with self._lock:
            return self._listening and self._empty_at == self._generation

    def admit(self, filtered: bool) -> Waiter | None:
        """A new waiter, or None when ``max_waiters`` already wait in this process."""
        with self._lock:
            if self._admitted >= self.max_waiters:
                return None
            self._admitted += 1
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._listen, name="ready-listener", daemon=True)
                self._thread.start()
        return Waiter(filtered=filtered)

    def leave(self, waiter: Waiter) -> None:
        """The waiter is done (answered, timed out, client gone); a wake-up it holds moves on."""
        with self._lock:
            self._admitted -= 1
            if waiter in self._queue:
                self._queue.remove(waiter)

    async def wait(self, waiter: Waiter, timeout_s: float) -> bool:
        """Queue the waiter and sleep until woken (True) or ``timeout_s`` passes (False)."""
        waiter.event.clear()
        waiter.woken = False
        with self._lock:
            self._queue.append(waiter)
        try:
            await asyncio.wait_for(waiter.event.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            with self._lock:
                if waiter in self._queue:
                    self._queue.remove(waiter)
                    return False
            # woken in the same instant: take the wake-up (it must not be lost)
        return True

    def pass_on(self, waiter: Waiter) -> None:
        """Wake the next waiter in ``waiter``'s chain, if the chain may go on."""
        if waiter.hops > 0:
            self._wake(waiter.hops - 1)

    def start_chain(self) -> None:
        """Something became ready (or the periodic check): wake the oldest waiter."""
        with self._lock:
            hops = len(self._queue) - 1  # the others: each is visited at most once
        if hops >= 0:
            self._wake(hops)

    def _wake(self, hops: int) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                waiter = self._queue.popleft()
                waiter.hops, waiter.woken = hops, True
            try:
                waiter.loop.call_soon_threadsafe(waiter.event.set)
                return
            except RuntimeError:  # its event loop is closed: the request is gone, wake the next
                hops -= 1
                if hops < 0:
                    return

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self.check_s + 5)

    def _listen(self) -> None:
        """Hold a LISTEN connection while anyone waits; reconnect after errors (a check per attempt)."""
        idle_since: float | None = None
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._bump(listening=True)
                    self.start_chain()  # anything that became ready before LISTEN
                    idle_since = self._serve(conn, idle_since)
                    self._bump(listening=False)
                    if idle_since is not None:
                        return
            except psycopg.Error as exc:
                self._bump(listening=False)
                log.warning("ready listener: %s; reconnecting in %.0f s", exc, _RECONNECT_S)
                self.start_chain()
                self._stop.wait(_RECONNECT_S)

    def _bump(self, listening: bool) -> None:
        with self._lock:
            self._generation += 1
            self._listening = listening

    def _serve(self, conn: psycopg.Connection, idle_since: float | None) -> float | None:
        """Wake chains on notifications and every ``check_s``; return when idle for a while (or stopped)."""
        next_check = time.monotonic() + self.check_s
        while not self._stop.is_set():
            heard = 0
            # short slices, so close() is answered within _STOP_POLL_S, not after a whole check_s
            wait = max(0.0, min(next_check - time.monotonic(), _STOP_POLL_S))
            for _ in conn.notifies(timeout=wait, stop_after=1):
                heard += 1
            if not heard and time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + self.check_s
            self.notifications += heard
            self._bump(listening=True)
            self.start_chain()
            with self._lock:
                idle = self._admitted == 0
                if not idle:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > 2 * self.check_s:
                    self._thread = None
                    return idle_since
        return idle_since

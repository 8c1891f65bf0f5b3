"""Admission of scoring requests (``POST /v1/score``, OpenRLHF): no request or key takes more than its share.

- **Pool slots across requests** (``score_pool_slots``): the pool tasks all scoring requests together may have
  queued or running in the shared process pool. A request whose spec may use the pool waits (on the event
  loop: no thread, no connection) until its window of slots is free, and its window is its share of the
  pool budget (``score_pool_max_in_flight``, at most the cap). The worker's own tasks therefore never queue
  behind more than ``score_pool_slots`` tasks of /v1/score, however many requests arrive.
- **Per key** (``score_max_in_flight_per_key``): requests of one key being scored at once; one more is a 429
  with ``Retry-After`` naming the limit, so one key cannot monopolise the scoring threads.

Slots and the key's count are released when the scoring itself ends (the executor's future), not when the
request does: a request whose client left still holds what its scoring holds.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from service.api.errors import ServiceError


class TooManyScoring(ServiceError):
    """429: the key has ``limit`` scoring requests in flight."""

    status_code = 429

    def __init__(self, message: str, retry_after_s: float, limit: int) -> None:
        super().__init__(message, detail={"retry_after_s": retry_after_s, "limit": limit,
                                          "setting": "score_max_in_flight_per_key"})
        self.headers = {"Retry-After": str(max(1, round(retry_after_s)))}


class ScoreGate:
    def __init__(self, pool_slots: int, per_key: int, retry_after_s: float = 1.0) -> None:
        if pool_slots < 1 or per_key < 1:
            raise ValueError("pool_slots and per_key must be >= 1")
        self.pool_slots, self.per_key, self.retry_after_s = pool_slots, per_key, retry_after_s
        self._lock = threading.Lock()
        self._by_key: dict[str, int] = {}
        self._free = pool_slots
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    # -- per key ------------------------------------------------------------------------------------------
    def enter_key(self, key: str) -> None:
        with self._lock:
            n = self._by_key.get(key, 0)
            if n >= self.per_key:
                raise TooManyScoring(
                    f"key: {n} scoring requests of this key are in flight, the limit of "
                    f"score_max_in_flight_per_key={self.per_key}; retry after {self.retry_after_s:g} s",
                    self.retry_after_s, self.per_key)
            self._by_key[key] = n + 1

    def leave_key(self, key: str) -> None:
        with self._lock:
            n = self._by_key.get(key, 1) - 1
            if n > 0:
                self._by_key[key] = n
            else:
                self._by_key.pop(key, None)

    def in_flight(self, key: str) -> int:
        with self._lock:
            return self._by_key.get(key, 0)

    # -- pool slots ---------------------------------------------------------------------------------------
    def window(self, wanted: int) -> int:
        return max(1, min(wanted, self.pool_slots))

    async def take_slots(self, n: int) -> None:
        """Wait until ``n`` slots are free (first come, first served), then take them."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._waiters and self._free >= n:
                self._free -= n
                return
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((n, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            with self._lock:
                if (n, waiter) in self._waiters:
                    self._waiters.remove((n, waiter))
                    self._wake_locked()
                    raise
            if not waiter.cancelled():  # granted just as the request was cancelled: hand them back
                self.give_slots(n)
            raise  # (a cancelled waiter's grant, if one is on its way, hands them back in _grant)

    def give_slots(self, n: int) -> None:
        with self._lock:
            self._free += n
            self._wake_locked()

    def _wake_locked(self) -> None:
        while self._waiters and self._free >= self._waiters[0][0]:
            n, waiter = self._waiters.pop(0)
            self._free -= n
            waiter.get_loop().call_soon_threadsafe(_grant, waiter, self, n)

    def release_when_done(self, future: Future, key: str | None, slots: int) -> None:
        """Give back the key's count and the slots once the scoring ``future`` ends (from any thread)."""
        def done(_: Future) -> None:
            if key is not None:
                self.leave_key(key)
            if slots:
                self.give_slots(slots)
        future.add_done_callback(done)


def _grant(waiter: asyncio.Future[None], gate: ScoreGate, n: int) -> None:
    if waiter.done():  # cancelled meanwhile: the slots go back
        gate.give_slots(n)
    else:
        waiter.set_result(None)

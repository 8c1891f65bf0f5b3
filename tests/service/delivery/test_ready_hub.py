"""ReadyHub: a NOTIFY wakes the oldest waiter only, wake-ups pass along a bounded chain, the cap holds."""

from __future__ import annotations

import asyncio
import time

import psycopg

from service.delivery.ready import CHANNEL, ReadyHub
from service.store.dbadmin import libpq_url


async def _listening(hub: ReadyHub) -> None:
    deadline = time.monotonic() + 20
    while hub.generation < 1 and time.monotonic() < deadline:  # the listener bumps it once LISTENing
        await asyncio.sleep(0.02)
    assert hub.generation >= 1


async def _scenario(conninfo: str) -> None:
    hub = ReadyHub(conninfo, max_waiters=3, check_s=30.0)
    try:
        waiters = [hub.admit(filtered=False) for _ in range(3)]
        assert None not in waiters and hub.admit(filtered=False) is None  # the cap
        await _listening(hub)
        tasks = [asyncio.ensure_future(hub.wait(w, 20)) for w in waiters]
        await asyncio.sleep(0.1)
        with psycopg.connect(conninfo, autocommit=True) as conn:  # what the trigger sends at commit
            conn.execute(f"NOTIFY {CHANNEL}")
        done, _ = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.2)
        assert [t.done() for t in tasks] == [True, False, False]  # only the oldest woke
        assert waiters[0].hops == 2  # it may pass the wake-up to the two behind it
        hub.pass_on(waiters[0])  # e.g. it got a batch: more may be ready
        await asyncio.sleep(0.2)
        assert [t.done() for t in tasks] == [True, True, False] and waiters[1].hops == 1
        hub.pass_on(waiters[1])
        await asyncio.sleep(0.2)
        assert all(t.done() for t in tasks) and waiters[2].hops == 0
        hub.pass_on(waiters[2])  # the end of the chain: nothing left to wake, no error
        for w in waiters:
            hub.leave(w)
        assert hub.waiting == 0 and hub.admit(filtered=True) is not None  # leaving frees the cap
        assert await asyncio.gather(*tasks) == [True, True, True]
    finally:
        hub.close()


async def _timeout(conninfo: str) -> None:
    hub = ReadyHub(conninfo, max_waiters=2, check_s=30.0)
    try:
        w = hub.admit(filtered=False)
        assert w is not None
        await _listening(hub)  # (once LISTENing the listener wakes the oldest waiter: a lost notify)
        start = time.monotonic()
        assert await hub.wait(w, 0.3) is False and time.monotonic() - start < 5
        hub.leave(w)
        assert hub.waiting == 0
        start = time.monotonic()
        hub.close()  # the listener waits in short slices: closing takes no whole check_s (30 s here)
        assert time.monotonic() - start < 5
    finally:
        hub.close()


def test_a_notification_wakes_the_oldest_waiter_and_the_chain_is_bounded(fresh_db):
    asyncio.run(_scenario(libpq_url(fresh_db)))


def test_a_waiter_times_out_and_leaves(fresh_db):
    asyncio.run(_timeout(libpq_url(fresh_db)))

"""KillablePool: results, task errors, hard timeouts, crashes, process-tree kill, threads, close."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest

from reward_models.pool import KillablePool, PoolTaskError
from tests.reward_models import tasks
from tests.reward_models.helpers import processes_with


@pytest.fixture(scope="module")
def pool() -> Iterator[KillablePool]:
    with KillablePool(processes=2, memory_mb=512) as p:
        yield p


def test_results_come_back_in_order(pool: KillablePool) -> None:
    futures = [pool.submit(tasks.add, i, i, timeout_s=10) for i in range(20)]
    assert [f.result() for f in futures] == [2 * i for i in range(20)]


def test_idle_workers_are_used_before_queueing_behind_a_busy_one(pool: KillablePool) -> None:
    sleeper = pool.submit(tasks.sleep, 2.0, timeout_s=10)
    quick = pool.submit(tasks.add, 1, 2, timeout_s=10)
    assert quick.result(timeout=30) == 3
    assert not sleeper.done()  # the quick task ran on the other worker, not behind the sleeper
    assert sleeper.result(timeout=30) == 2.0


def test_exception_in_a_task_is_reported(pool: KillablePool) -> None:
    with pytest.raises(PoolTaskError, match="task raised ValueError: bad input"):
        pool.submit(tasks.fail, "bad input", timeout_s=10).result()
    assert pool.submit(tasks.add, 1, 2, timeout_s=10).result() == 3


def test_timeout_kills_the_worker_and_the_pool_goes_on(pool: KillablePool) -> None:
    before = set(pool.worker_pids())
    spinning = pool.submit(tasks.spin, timeout_s=0.5)
    with pytest.raises(PoolTaskError, match=r"^timeout after 0.5s$"):
        spinning.result(timeout=30)
    assert pool.submit(tasks.add, 2, 2, timeout_s=10).result() == 4
    assert set(pool.worker_pids()) != before  # the spinning worker was replaced


def test_worker_crash_is_an_error(pool: KillablePool) -> None:
    with pytest.raises(PoolTaskError, match="worker crashed: exit code -9"):
        pool.submit(tasks.die, timeout_s=10).result(timeout=30)
    assert pool.submit(tasks.add, 3, 3, timeout_s=10).result() == 6


def test_timeout_kills_the_workers_children_too(pool: KillablePool) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.25"
    with pytest.raises(PoolTaskError, match="timeout"):
        pool.submit(tasks.spawn_child_and_hang, marker, timeout_s=1.0).result(timeout=30)
    assert processes_with(marker) == []


def test_memory_limit_is_an_error(pool: KillablePool) -> None:
    with pytest.raises(PoolTaskError, match="MemoryError|worker crashed"):
        pool.submit(tasks.allocate, 2048, timeout_s=30).result(timeout=60)
    assert pool.submit(tasks.allocate, 16, timeout_s=30).result() == 16 * 2**20


def test_unpicklable_task_and_result_are_errors(pool: KillablePool) -> None:
    with pytest.raises(PoolTaskError, match="could not send the task"):
        pool.submit(tasks.add, threading.Lock(), 1, timeout_s=10).result(timeout=30)
    with pytest.raises(PoolTaskError, match="could not send the result"):
        pool.submit(tasks.unpicklable_result, timeout_s=10).result(timeout=30)
    assert pool.submit(tasks.add, 1, 1, timeout_s=10).result() == 2


def test_submit_from_many_threads(pool: KillablePool) -> None:
    results: dict[int, int] = {}

    def worker(k: int) -> None:
        futures = [pool.submit(tasks.add, k, i, timeout_s=10) for i in range(10)]
        results[k] = sum(f.result() for f in futures)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: 10 * k + 45 for k in range(8)}


def test_tasks_queued_behind_a_timeout_or_crash_still_run() -> None:
    """One worker holds the running task and the next; the next must survive its neighbour's death."""
    with KillablePool(processes=1) as single:
        spinning = single.submit(tasks.spin, timeout_s=0.5)
        behind_spin = single.submit(tasks.add, 1, 1, timeout_s=10)
        dying = single.submit(tasks.die, timeout_s=10)
        behind_crash = single.submit(tasks.add, 2, 2, timeout_s=10)
        with pytest.raises(PoolTaskError, match="timeout"):
            spinning.result(timeout=30)
        assert behind_spin.result(timeout=30) == 2
        with pytest.raises(PoolTaskError, match="worker crashed"):
            dying.result(timeout=30)
        assert behind_crash.result(timeout=30) == 4


def test_a_worker_killed_while_idle_is_replaced() -> None:
    """A task that meets a worker killed from outside either runs on a fresh worker or reports
    "worker crashed" (it may have been in the dead worker's pipe): never a hang, never a wrong value;
    the pool goes on."""
    with KillablePool(processes=1) as single:
        assert single.submit(tasks.add, 1, 1, timeout_s=10).result(timeout=30) == 2
        for i in range(5):
            [pid] = single.worker_pids()
            os.kill(pid, signal.SIGKILL)
            try:
                assert single.submit(tasks.add, i, i, timeout_s=10).result(timeout=30) == 2 * i
            except PoolTaskError as exc:
                assert str(exc) == "worker crashed: exit code -9"
            assert single.submit(tasks.add, i, 1, timeout_s=10).result(timeout=30) == i + 1


def test_deadline_counts_from_when_a_task_starts() -> None:
    """A queued task does not burn its deadline while the one before it runs."""
    with KillablePool(processes=1) as single:
        first = single.submit(tasks.sleep, 1.0, timeout_s=5)
        second = single.submit(tasks.sleep, 1.0, timeout_s=1.6)  # done 2 s after submission, 1 s of work
        assert first.result(timeout=30) == 1.0 and second.result(timeout=30) == 1.0


def test_worker_start_up_does_not_count_against_a_deadline() -> None:
    with KillablePool(processes=1, start_method="spawn", preload=["tests.reward_models.slow_import"]) as slow:
        assert slow.submit(tasks.add, 2, 3, timeout_s=0.5).result(timeout=60) == 5


def test_close_fails_queued_tasks_and_refuses_new_ones() -> None:
    small = KillablePool(processes=1)
    running = small.submit(tasks.spin, timeout_s=60)
    queued = small.submit(tasks.add, 1, 1, timeout_s=60)
    small.close()
    for future in (running, queued):
        with pytest.raises(PoolTaskError, match="pool closed"):
            future.result(timeout=30)
    with pytest.raises(PoolTaskError, match="pool closed"):
        small.submit(tasks.add, 1, 1, timeout_s=1).result()
    small.close()  # idempotent


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="processes"):
        KillablePool(processes=0)
    with pytest.raises(ValueError, match="valid: forkserver, spawn"):
        KillablePool(start_method="fork")  # type: ignore[arg-type]

"""Scorer: run a reward spec over many samples.

Cheap components run inline through ``score_batch`` (the reward model batches, the LLM judge and
the LLM judge uses threads); ``cpu_heavy`` ones (math verification, the code sandbox, JSON schemas,
user regexes RE2 cannot run) and any item a component's ``in_pool`` sends there (a user regex on a text
too long to match inline) go to a KillablePool, one task per sample with a hard deadline. A task that
passes its deadline, or whose worker crashes twice on it (the memory limit, a segfault in a parser), is
attributed by a canary (``attribute_timeout``): the answer's fault (0) when the same component verifies
its canary in the same pool now, the verifier's (an error) when not. Heavy tasks are submitted first so
they overlap the inline work. Component instances are cached per ``(kind, params)``, so a reward model loads once.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from reward_models.base import ComponentResult, PromptInfo, RewardComponent, Sample, error_result
from reward_models.llm_judge import JudgeEndpoint
from reward_models.pool import KillablePool, PoolTaskError
from reward_models.registry import make_component
from reward_models.spec import RewardSpec, ScoredSample, combine

_PRELOAD = ("reward_models.registry", "reward_models.warmup")
VERIFICATION_TIMEOUT = "verification_timeout"
VERIFIER_CRASHED = "verifier_crashed"  # the answer crashed the verifier's worker twice; its canary passed


def params_key(params: dict[str, Any]) -> str:
    """Canonical JSON of params: the cache key of a component instance."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=64)
def _worker_component(kind: str, key: str) -> RewardComponent:
    return make_component(kind, json.loads(key))


def score_in_worker(kind: str, key: str, sample: Sample, prompt: PromptInfo) -> ComponentResult:
    """Pool task: score one sample with the (per-worker cached) component ``(kind, params)``."""
    return _worker_component(kind, key).score(sample, prompt)


def canary_in_worker(kind: str, key: str) -> ComponentResult:
    """Pool task: the component ``(kind, params)`` scores its own known-easy canary item."""
    component = _worker_component(kind, key)
    return component.score(*component.canary())


@dataclass(frozen=True, slots=True)
class PoolBudget:
    """What one call may take of the shared pool: at most ``max_in_flight`` of its tasks queued or
    running at a time (so other callers' tasks interleave with its), all finished within ``seconds``."""

    seconds: float = math.inf
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0 or (self.max_in_flight is not None and self.max_in_flight < 1):
            raise ValueError("PoolBudget: seconds must be > 0 and max_in_flight >= 1")


class PoolBudgetExceeded(Exception):
    """A call's pool tasks did not finish within its budget; its queued tasks were cancelled."""


# component name, item index, kind, params key, item, the task's deadline (s)
_Task = tuple[str, int, str, str, Sample, PromptInfo, float]


class Scorer:
    """Scores ``(Sample, PromptInfo)`` items under a RewardSpec. ``processes`` pool workers run the
    ``cpu_heavy`` components with ``timeout_s`` per sample and ``memory_mb`` address space each."""

    def __init__(
        self,
        processes: int = 1,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        judge_endpoints: Mapping[str, JudgeEndpoint] | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self.processes, self.timeout_s, self.memory_mb = processes, timeout_s, memory_mb
        self.judge_endpoints = dict(judge_endpoints or {})  # the deployment's, by name
        self._components: dict[tuple[str, str], RewardComponent] = {}
        self._pool: KillablePool | None = None
        self._lock = threading.Lock()

    def component(self, kind: str, params: dict[str, Any]) -> RewardComponent:
        """The cached instance for ``(kind, params)``, built on first use."""
        key = (kind, params_key(params))
        with self._lock:
            if key not in self._components:
                self._components[key] = make_component(kind, params, judge_endpoints=self.judge_endpoints)
            return self._components[key]

    def _get_pool(self) -> KillablePool:
        with self._lock:
            if self._pool is None:
                self._pool = KillablePool(self.processes, memory_mb=self.memory_mb, preload=_PRELOAD)
            return self._pool

    def score(self, spec: RewardSpec, items: list[tuple[Sample, PromptInfo]],
              budget: PoolBudget | None = None) -> list[ScoredSample]:
        """One ScoredSample per item, in order. With ``budget``, the pool work is bounded by it
        (PoolBudgetExceeded when it runs out); without, every pool task is queued at once."""
        if not items:
            return []
        components = {c.name: self.component(c.kind, c.params) for c in spec.components}
        heavy: list[_Task] = [
            (c.name, i, c.kind, params_key(c.params), s, p, max(self.timeout_s, components[c.name].deadline_s()))
            for c in spec.components
            for i, (s, p) in enumerate(items)
            if components[c.name].in_pool(s, p)
        ]
        feed = _Feed(self, heavy, budget or PoolBudget())
        feed.top_up()  # heavy tasks first, so they overlap the inline work
        in_pool = {(name, i) for name, i, *_ in heavy}
        results: dict[str, list[ComponentResult]] = {}
        for c in spec.components:
            results[c.name] = [error_result("unset")] * len(items)
            inline = [i for i in range(len(items)) if (c.name, i) not in in_pool]
            if inline:
                for i, r in zip(inline, _inline(components[c.name], [items[i] for i in inline]), strict=True):
                    results[c.name][i] = r
        collected: dict[str, dict[int, ComponentResult | _Timeout]] = {}
        for task, outcome in zip(heavy, feed.finish(), strict=True):
            if isinstance(outcome, _Timeout) and outcome.crashed:  # once more: a crash must be the answer's
                _, _, kind, key, sample, prompt, timeout_s = task
                outcome = _collect(self._get_pool().submit(
                    score_in_worker, kind, key, sample, prompt, timeout_s=timeout_s))
            collected.setdefault(task[0], {})[task[1]] = outcome
        for c in spec.components:
            if c.name in collected:
                got = collected[c.name]
                attributed = self._attribute(c.kind, params_key(c.params), list(got.values()))
                for i, r in zip(got, attributed, strict=True):
                    results[c.name][i] = r
        return [combine(spec, {name: rs[i] for name, rs in results.items()}, items[i][0].finish_reason)
                for i in range(len(items))]

    def _attribute(self, kind: str, key: str, collected: list[ComponentResult | _Timeout]) -> list[ComponentResult]:
        """The pool's answers; timeouts are attributed by one canary (see ``attribute_timeout``)."""
        if not any(isinstance(r, _Timeout) for r in collected):
            return collected  # type: ignore[return-value]
        healthy, canary = self._canary(kind, key)
        return [
            attribute_timeout(r, self.timeout_s, healthy, canary) if isinstance(r, _Timeout) else r
            for r in collected
        ]

    def _canary(self, kind: str, key: str) -> tuple[bool, str]:
        """Does the same component verify its canary within the same deadline in this pool now?"""
        start = time.perf_counter()
        future = self._get_pool().submit(canary_in_worker, kind, key, timeout_s=self.timeout_s)
        outcome = _collect(future)
        ms = (time.perf_counter() - start) * 1000.0
        if isinstance(outcome, _Timeout):
            return False, f"canary also timed out ({outcome.message})"
        if outcome.error is not None:
            return False, f"canary failed: {outcome.error}"
        if ms > self.timeout_s * 1000.0:  # by our clock, not only the pool's: within the same deadline
            return False, f"canary verified in {ms:.0f} ms, past the {self.timeout_s:g} s deadline"
        return True, f"canary verified in {ms:.0f} ms"

    def close(self) -> None:
        """Stop the worker pool (components stay cached)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class _Timeout:
    """A pool task that passed its deadline, or (``crashed``) whose worker died on it."""

    message: str
    crashed: bool = False


def _collect(future: Future) -> ComponentResult | _Timeout:
    """A pool task's result; its deadline passing or its worker crashing is a ``_Timeout`` (attributed
    by the canary), any other failure (the pool closed, the task could not be sent) an error."""
    try:
        return future.result()
    except PoolTaskError as exc:
        if str(exc).startswith("timeout"):
            return _Timeout(str(exc))
        if str(exc).startswith(("worker crashed", "task raised MemoryError")):  # died on it, or its memory limit
            return _Timeout(str(exc), crashed=True)
        return error_result(str(exc))


def attribute_timeout(timeout: _Timeout, timeout_s: float, healthy: bool, canary: str) -> ComponentResult:
    """The timeout rule: an answer whose verification passed the deadline while the same component
    verified its canary within the same deadline is a fail (0, ``details.reason =
    "verification_timeout"``): the answer made verification slow. If the canary failed too, the
    verifier is at fault: an error (the group is not scored on it)."""
    latency = timeout_s * 1000.0
    if healthy:
        reason = VERIFIER_CRASHED if timeout.crashed else VERIFICATION_TIMEOUT
        details = {"reason": reason, "timeout_s": timeout_s, "canary": canary, "pool": timeout.message}
        return ComponentResult(value=0.0, details=details, latency_ms=latency)
    return error_result(f"{timeout.message}; {canary}", {"reason": "verifier_unhealthy"}, latency_ms=latency)


class _Feed:
    """Submits one call's pool tasks at most ``max_in_flight`` at a time and collects them, in order,
    by the budget's deadline; past it the unfinished tasks are cancelled and PoolBudgetExceeded raised."""

    def __init__(self, scorer: Scorer, tasks: list[_Task], budget: PoolBudget) -> None:
        self.scorer, self.tasks, self.budget = scorer, tasks, budget
        self.window = budget.max_in_flight or max(len(tasks), 1)
        self.deadline = time.monotonic() + budget.seconds
        self.futures: list[Future] = []

    def top_up(self) -> None:
        """Submit tasks until ``window`` of them are unfinished (or none is left)."""
        running = sum(1 for f in self.futures if not f.done())
        while running < self.window and len(self.futures) < len(self.tasks):
            _, _, kind, key, sample, prompt, timeout_s = self.tasks[len(self.futures)]
            pool = self.scorer._get_pool()
            self.futures.append(pool.submit(score_in_worker, kind, key, sample, prompt, timeout_s=timeout_s))
            running += 1

    def finish(self) -> list[ComponentResult | _Timeout]:
        if self.budget.seconds == math.inf and len(self.futures) == len(self.tasks):  # unbounded: all queued
            return [_collect(f) for f in self.futures]
        while True:
            self.top_up()
            pending = [f for f in self.futures if not f.done()]
            if not pending and len(self.futures) == len(self.tasks):
                return [_collect(f) for f in self.futures]
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            wait(pending, timeout=None if left == math.inf else left, return_when=FIRST_COMPLETED)
        for f in self.futures:
            f.cancel()  # the queued ones; a running task ends by its own deadline
        done = sum(1 for f in self.futures if f.done() and not f.cancelled())
        raise PoolBudgetExceeded(f"{done} of {len(self.tasks)} pool tasks finished within the budget of "
                                 f"{self.budget.seconds:g} s")


def _inline(component: RewardComponent, items: list[tuple[Sample, PromptInfo]]) -> list[ComponentResult]:
    """``score_batch`` with its failures (an exception, a wrong count) turned into error results."""
    try:
        results = component.score_batch(items)
    except Exception as exc:  # noqa: BLE001 - recorded per sample, never a silent 0
        return [error_result(f"{type(exc).__name__}: {exc}") for _ in items]
    if len(results) != len(items):
        return [
            error_result(f"{component.kind}: score_batch returned {len(results)} results for {len(items)}")
            for _ in items
        ]
    return results

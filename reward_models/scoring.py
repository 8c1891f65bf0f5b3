"""Scorer: run a reward spec over many samples.

Cheap components run inline through ``score_batch`` (the reward model batches, the LLM judge and
the LLM judge uses threads); ``cpu_heavy`` ones (math verification, the code sandbox, JSON schemas,
user regexes RE2 cannot run) and any item a component's ``in_pool`` sends there (a user regex on a text
too long to match inline) go to a KillablePool, one task per sample with a hard deadline. A task that
passes its deadline is attributed by a canary (``attribute_timeout``). Heavy tasks are submitted first so they overlap the inline
work. Component instances are cached per ``(kind, params)``, so a reward model loads once.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from reward_models.base import ComponentResult, PromptInfo, RewardComponent, Sample, error_result
from reward_models.llm_judge import JudgeEndpoint
from reward_models.pool import KillablePool, PoolTaskError
from reward_models.registry import make_component
from reward_models.spec import RewardSpec, ScoredSample, combine

_PRELOAD = ("reward_models.registry", "reward_models.warmup")
VERIFICATION_TIMEOUT = "verification_timeout"


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

    def score(self, spec: RewardSpec, items: list[tuple[Sample, PromptInfo]]) -> list[ScoredSample]:
        """One ScoredSample per item, in order."""
        if not items:
            return []
        components = {c.name: self.component(c.kind, c.params) for c in spec.components}
        pending: dict[str, dict[int, Future]] = {}
        for c in spec.components:
            component = components[c.name]
            heavy = [i for i, (s, p) in enumerate(items) if component.in_pool(s, p)]
            if heavy:
                pool, key = self._get_pool(), params_key(c.params)
                timeout_s = max(self.timeout_s, component.deadline_s())
                pending[c.name] = {
                    i: pool.submit(score_in_worker, c.kind, key, *items[i], timeout_s=timeout_s) for i in heavy
                }
        results: dict[str, list[ComponentResult | None]] = {}
        for c in spec.components:
            inline = [i for i in range(len(items)) if i not in pending.get(c.name, {})]
            results[c.name] = [None] * len(items)
            if inline:
                for i, r in zip(inline, _inline(components[c.name], [items[i] for i in inline]), strict=True):
                    results[c.name][i] = r
        for c in spec.components:
            if c.name in pending:
                futures = pending[c.name]
                for i, r in zip(futures, self._collect_all(c.kind, params_key(c.params), list(futures.values())),
                                strict=True):
                    results[c.name][i] = r
        return [combine(spec, {name: rs[i] for name, rs in results.items()}) for i in range(len(items))]  # type: ignore[misc]

    def _collect_all(self, kind: str, key: str, futures: list[Future]) -> list[ComponentResult]:
        """The pool's answers; timeouts are attributed by one canary (see ``attribute_timeout``)."""
        collected = [_collect(f) for f in futures]
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
    message: str


def _collect(future: Future) -> ComponentResult | _Timeout:
    """A pool task's result; its deadline passing is a ``_Timeout``, any other failure an error."""
    try:
        return future.result()
    except PoolTaskError as exc:
        if str(exc).startswith("timeout"):
            return _Timeout(str(exc))
        return error_result(str(exc))


def attribute_timeout(timeout: _Timeout, timeout_s: float, healthy: bool, canary: str) -> ComponentResult:
    """The timeout rule: an answer whose verification passed the deadline while the same component
    verified its canary within the same deadline is a fail (0, ``details.reason =
    "verification_timeout"``): the answer made verification slow. If the canary failed too, the
    verifier is at fault: an error (the group is not scored on it)."""
    latency = timeout_s * 1000.0
    if healthy:
        details = {"reason": VERIFICATION_TIMEOUT, "timeout_s": timeout_s, "canary": canary}
        return ComponentResult(value=0.0, details=details, latency_ms=latency)
    return error_result(f"{timeout.message}; {canary}", {"reason": "verifier_unhealthy"}, latency_ms=latency)


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

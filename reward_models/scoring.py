"""Scorer: run a reward spec over many samples.

Cheap components run inline through ``score_batch`` (the reward model batches, the LLM judge and
the code sandbox use threads); ``cpu_heavy`` ones (math verification) go to a KillablePool, one
task per sample with a hard deadline. Heavy tasks are submitted first so they overlap the inline
work. Component instances are cached per ``(kind, params)``, so a reward model loads once.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from reward_models.base import ComponentResult, PromptInfo, RewardComponent, Sample, error_result
from reward_models.llm_judge import JudgeEndpoint
from reward_models.pool import KillablePool, PoolTaskError
from reward_models.registry import make_component
from reward_models.spec import RewardSpec, ScoredSample, combine

_PRELOAD = ("reward_models.registry", "reward_models.warmup")


def params_key(params: dict[str, Any]) -> str:
    """Canonical JSON of params: the cache key of a component instance."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=64)
def _worker_component(kind: str, key: str) -> RewardComponent:
    return make_component(kind, json.loads(key))


def score_in_worker(kind: str, key: str, sample: Sample, prompt: PromptInfo) -> ComponentResult:
    """Pool task: score one sample with the (per-worker cached) component ``(kind, params)``."""
    return _worker_component(kind, key).score(sample, prompt)


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
        pending: dict[str, list[Future]] = {}
        for c in spec.components:
            if components[c.name].cpu_heavy:
                pool, key = self._get_pool(), params_key(c.params)
                pending[c.name] = [
                    pool.submit(score_in_worker, c.kind, key, s, p, timeout_s=self.timeout_s)
                    for s, p in items
                ]
        results: dict[str, list[ComponentResult]] = {}
        for c in spec.components:
            if c.name not in pending:
                results[c.name] = _inline(components[c.name], items)
        for name, futures in pending.items():
            results[name] = [self._collect(f) for f in futures]
        return [combine(spec, {name: rs[i] for name, rs in results.items()}) for i in range(len(items))]

    def _collect(self, future: Future) -> ComponentResult:
        try:
            return future.result()
        except PoolTaskError as exc:
            latency = self.timeout_s * 1000.0 if str(exc).startswith("timeout") else 0.0
            return error_result(str(exc), latency_ms=latency)

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

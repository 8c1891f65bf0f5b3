"""Reward specs: named, weighted components with one outcome; total = weighted sum.

Versioning (immutable once used) is the service's job; a spec here is the content of one version.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from filters.types import FAILED_OUTCOME_REASONS
from reward_models.base import MAX_REWARD_MAGNITUDE, ComponentResult, error_result
from reward_models.registry import KINDS, make_component

# any characters except control characters and '@' ("name@3" refers to version 3 of "name")
NAME_PATTERN = r"^[^@\x00-\x1f\x7f-\x9f]+$"


class ComponentSpec(BaseModel):
    """One named component of a spec: ``kind`` from the registry, its ``params`` and ``weight``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=100)
    kind: str
    weight: float = 1.0
    params: dict[str, Any] = Field(default_factory=dict)
    outcome: bool = False


def _check_component(index: int, spec: ComponentSpec) -> None:
    where = f"components[{index}]"
    if spec.kind not in KINDS:
        raise ValueError(f"{where}.kind: unknown kind {spec.kind!r}; valid: {', '.join(sorted(KINDS))}")
    if not (math.isfinite(spec.weight) and abs(spec.weight) <= MAX_REWARD_MAGNITUDE):
        raise ValueError(f"{where}.weight: must be finite and within [-1e6, 1e6], got {spec.weight}")
    try:
        make_component(spec.kind, spec.params)
    except ValueError as exc:
        raise ValueError(f"{where}.params: {exc}") from None


class RewardSpec(BaseModel):
    """A reward spec. If no component is marked ``outcome``, the first ``verifier.*`` one is."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200, pattern=NAME_PATTERN)
    components: list[ComponentSpec]

    @field_validator("components")
    @classmethod
    def _components(cls, components: list[ComponentSpec]) -> list[ComponentSpec]:
        if not components:
            raise ValueError("components: at least one component is required")
        seen: set[str] = set()
        for index, spec in enumerate(components):
            if spec.name in seen:
                raise ValueError(f"components[{index}].name: duplicate name {spec.name!r}")
            seen.add(spec.name)
            _check_component(index, spec)
        outcomes = [i for i, c in enumerate(components) if c.outcome]
        if len(outcomes) > 1:
            raise ValueError(f"components[{outcomes[1]}].outcome: at most one component is the outcome")
        return components

    def reference_fields(self) -> dict[str, list[str]]:
        """The ``reference`` fields the spec needs -> the components that need each (from their kinds)."""
        needs: dict[str, list[str]] = {}
        for c in self.components:
            for field in KINDS[c.kind].reference_fields:
                needs.setdefault(field, []).append(c.name)
        return needs

    def reference_problem(self, reference: Mapping[str, Any]) -> tuple[str, str, str] | None:
        """(field, what is wrong, component) of the first component that could not score a prompt
        with this ``reference`` (each kind checks its own fields), else None."""
        for c in self.components:
            problem = KINDS[c.kind].reference_problem(reference)
            if problem is not None:
                return (*problem, c.name)
        return None

    def outcome_name(self) -> str | None:
        """The outcome component: the one marked, else the first ``verifier.*``, else None."""
        marked = [c.name for c in self.components if c.outcome]
        if marked:
            return marked[0]
        return next((c.name for c in self.components if c.kind.startswith("verifier.")), None)


@dataclass(slots=True)
class ScoredSample:
    """Per-component results of one sample, the weighted total (None if any component errored) and
    the outcome component's value (None if it errored or the spec has none)."""

    components: dict[str, ComponentResult]
    total: float | None
    outcome: float | None


def _finite(r: ComponentResult) -> ComponentResult:
    """A NaN / inf value is a component error (it would poison totals and advantages), never a score; so is
    a value beyond +-MAX_REWARD_MAGNITUDE (a reported 1e300 is finite, but its square in the reward
    statistics is not: the bound keeps every sum of products finite)."""
    if r.value is None:
        return r
    if not math.isfinite(r.value):
        return error_result(f"non-finite value {r.value!r}", r.details, r.latency_ms)
    if abs(r.value) > MAX_REWARD_MAGNITUDE:
        return error_result(f"value {r.value!r} outside [-{MAX_REWARD_MAGNITUDE:g}, {MAX_REWARD_MAGNITUDE:g}], the "
                            "range of a reward", {**r.details, "value": r.value}, r.latency_ms)
    return r


def combine(spec: RewardSpec, results: dict[str, ComponentResult], finish_reason: str | None = None) -> ScoredSample:
    """Weighted sum ``total = sum_k w_k * r_k`` over the spec's components; missing or errored -> None.

    A total that is not finite (finite values whose weighted sum overflows) is an error too: the
    largest contributor becomes an error naming the overflow, so a null total always has a reason.
    A trajectory that ended as the model's failure (``finish_reason`` in ``FAILED_OUTCOME_REASONS``: a tool
    misuse) has a failed outcome whatever it answered after: its outcome component and every other component
    that grades the answer (every kind but ``rule.*``: verifiers, judges, reward models, environment-reported
    values) are 0 (what they would have scored is kept in the details), and the total is summed with those
    0s, so no spec, with or without an outcome component, pays a misuse for its answer."""
    results = {name: _finite(r) for name, r in results.items()}
    outcome_name = spec.outcome_name()
    if finish_reason in FAILED_OUTCOME_REASONS:
        for c in spec.components:  # everything that grades the answer; rule.* components judge behaviour
            if c.name == outcome_name or not c.kind.startswith("rule."):
                results[c.name] = _failed(results.get(c.name), finish_reason)
    values = [results[c.name].value if c.name in results else None for c in spec.components]
    results = dict(results)
    total: float | None = None
    if all(v is not None for v in values):
        terms = [(c.name, c.weight * v) for c, v in zip(spec.components, values, strict=True) if v is not None]
        total = _weighted_sum([t for _, t in terms])
        if total is None:
            name = max(terms, key=lambda t: abs(t[1]) if math.isfinite(t[1]) else math.inf)[0]
            results[name] = _overflowed(results[name], [c.weight for c in spec.components if c.name == name][0])
    outcome = results[outcome_name].value if outcome_name in results else None
    return ScoredSample(components=results, total=total, outcome=outcome)


def _failed(result: ComponentResult | None, finish_reason: str) -> ComponentResult:
    """The outcome of a trajectory the model failed (``finish_reason``): 0, whatever its answer scored."""
    details = {} if result is None else {**result.details, "value": result.value, "error": result.error}
    return ComponentResult(value=0.0, details={**details, "failed_outcome": f"finish_reason {finish_reason}"},
                           latency_ms=0.0 if result is None else result.latency_ms)


def _weighted_sum(terms: list[float]) -> float | None:
    """``fsum`` of the terms; None when it is not finite (an overflowing term or partial sum)."""
    try:
        total = math.fsum(terms)
    except (OverflowError, ValueError):  # an intermediate overflow, or inf + -inf
        return None
    return total if math.isfinite(total) else None


def _overflowed(result: ComponentResult, weight: float) -> ComponentResult:
    return ComponentResult(
        value=None, error=f"weighted total not finite: weight {weight} * value {result.value} overflows",
        details={**result.details, "value": result.value}, latency_ms=result.latency_ms)

"""TRL: one reward function per component of a reward spec, for ``GRPOTrainer(reward_funcs=...)``.

    funcs, weights = reward_funcs("math-r1", url="http://curator:8000")
    trainer = GRPOTrainer(model=..., reward_funcs=funcs, args=GRPOConfig(reward_weights=weights, ...),
                          train_dataset=dataset)   # a column "answer" (or ground_truth / solution)

Each function is named after its component, so TRL logs ``rewards/<component>/mean``; it returns the
component's value per completion. A completion whose total is ``None`` (any component errored) is ``None``
from every function (``all_or_nothing=True``, the default): TRL then masks the row (no advantage, out of
the group's baseline) instead of adding the other components with ``nansum`` as if the errored one were 0.
``all_or_nothing=False`` returns ``None`` only where that component itself errored.

The functions share one ``POST /v1/score`` per batch: the first call scores every component and the others read its answer. Scoring uses the spec version the functions and weights were read from.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import orjson

from grpo_curator_integrations._http import Client, ScoringError, Target, jsonable, target, tools_of

REFERENCE_COLUMNS = ("answer", "ground_truth", "solution")
RewardFunc = Callable[..., list[float | None]]


def _reference(kwargs: dict[str, Any], column: str | None, i: int) -> dict[str, Any]:
    """The reference of completion ``i`` from TRL's column keyword arguments: ``column`` if given, else the
    first of answer / ground_truth / solution. A dict cell is the whole reference."""
    names = (column,) if column else REFERENCE_COLUMNS
    for name in names:
        values = kwargs.get(name)
        if values is not None:
            cell = jsonable(values[i])
            return cell if isinstance(cell, dict) else {"answer": cell}
    if column:
        raise KeyError(f"reference_column {column!r} is not a dataset column (TRL passed: {sorted(kwargs)})")
    return {}


def _items(prompts: list[Any], completions: list[Any], completion_ids: list[Any] | None,
           kwargs: dict[str, Any], column: str | None) -> list[dict[str, Any]]:
    items = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        item: dict[str, Any] = {"prompt": jsonable(prompt), "completion": jsonable(completion),
                                "reference": _reference(kwargs, column, i)}
        if completion_ids is not None:
            item["num_tokens"] = len(completion_ids[i])
        tools = tools_of(kwargs["tools"][i]) if kwargs.get("tools") is not None else None
        if tools is not None:  # a dataset column "tools": the prompt's tool definitions (rule.tool_calls)
            item["tools"] = tools
        items.append(item)
    return items


class _Batch:
    """Scores a batch once for all the component functions (keyed by the batch's content)."""

    def __init__(self, client: Client, column: str | None) -> None:
        self.client, self.column = client, column
        self._lock = threading.Lock()
        self._key: str | None = None
        self._results: list[dict[str, Any]] = []

    def results(self, prompts: list[Any], completions: list[Any], completion_ids: list[Any] | None,
                kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        items = _items(prompts, completions, completion_ids, kwargs, self.column)
        key = hashlib.sha256(orjson.dumps(items, option=orjson.OPT_SORT_KEYS)).hexdigest()
        with self._lock:
            if key != self._key:
                self._results, self._key = self.client.score(items), key
            return self._results


def _component_func(name: str, batch: _Batch, all_or_nothing: bool) -> RewardFunc:
    def func(prompts: list[Any], completions: list[Any], completion_ids: list[Any] | None = None,
             **kwargs: Any) -> list[float | None]:
        results = batch.results(prompts, completions, completion_ids, kwargs)
        missing = next((r for r in results if name not in r["rewards"]), None)
        if missing is not None:
            raise ScoringError(f"component {name!r} is not in the service's answer (it has "
                               f"{sorted(missing['rewards'])}): the reward spec changed under a running trainer")
        if all_or_nothing:
            return [None if r["total"] is None else r["rewards"][name]["value"] for r in results]
        return [r["rewards"][name]["value"] for r in results]

    func.__name__ = func.__qualname__ = name
    return func


def reward_funcs(spec: str | None = None, url: str | None = None, api_key: str | None = None,
                 reference_column: str | None = None,
                 all_or_nothing: bool = True) -> tuple[list[RewardFunc], list[float]]:
    """``(functions, weights)``: one function per component of ``spec`` (``name`` or ``name@version``) and the
    spec's weights, for ``GRPOConfig(reward_weights=weights)``. Scoring is pinned to the version the weights
    came from (``name@version``), so a version published during the run never changes the rewards.
    ``all_or_nothing`` (default): a completion with no total is ``None`` from every function, so TRL masks it.
    The key needs a role that reads reward specs and scores: ``trainer`` (or admin)."""
    t = target(url, spec, api_key)
    reader = Client(t)
    try:
        found = reader.spec()
    finally:
        reader.close()
    client = Client(Target(t.url, f"{found['name']}@{found['version']}", t.api_key))
    components = found["body"]["components"]
    batch = _Batch(client, reference_column)
    return [_component_func(c["name"], batch, all_or_nothing) for c in components], [float(c["weight"]) for c in components]

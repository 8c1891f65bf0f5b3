"""verl: ``compute_score`` for ``custom_reward_function`` and a batched variant for the batch reward manager.

    custom_reward_function.path=integrations/verl.py custom_reward_function.name=compute_score
    +custom_reward_function.reward_kwargs.spec=math-r1 +custom_reward_function.reward_kwargs.url=http://...

Both return ``{"score": total, "<component>": value, ...}`` so verl logs each part. When an item cannot be
scored (a component errored) ``on_error`` decides: ``"raise"`` (default: a ScoringError stops the step) or a
number that replaces the total and the errored components, with ``"reward_error": 1.0`` in the dict.
"""

from __future__ import annotations

import threading
from typing import Any

from integrations._http import Client, ScoringError, Target, jsonable, target

_clients: dict[Target, Client] = {}
_lock = threading.Lock()


def _client(url: str | None, spec: str | None, api_key: str | None) -> Client:
    t = target(url, spec, api_key)
    with _lock:
        if t not in _clients:
            _clients[t] = Client(t)
        return _clients[t]


def _item(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any) -> dict[str, Any]:
    truth = jsonable(ground_truth)
    extra = jsonable(extra_info) if extra_info is not None else {}
    return {"prompt": "", "completion": str(solution_str), "dataset": str(data_source or "default"),
            "reference": truth if isinstance(truth, dict) else {"answer": truth},
            "metadata": extra if isinstance(extra, dict) else {"extra_info": extra}}


def _as_dict(result: dict[str, Any], on_error: str | float) -> dict[str, Any]:
    out: dict[str, Any] = {"score": result["total"]}
    errors = {n: c["error"] for n, c in result["rewards"].items() if c["error"] is not None}
    if result["total"] is None:
        if on_error == "raise":
            raise ScoringError(f"could not score: {errors}")
        out["score"] = float(on_error)
    for name, comp in result["rewards"].items():
        out[name] = comp["value"] if comp["value"] is not None else float(on_error)
    if on_error != "raise":
        out["reward_error"] = float(bool(errors))
    return out


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                  spec: str | None = None, url: str | None = None, api_key: str | None = None,
                  on_error: str | float = "raise", **kwargs: Any) -> dict[str, Any]:
    """verl's reward-function signature: one response -> ``{"score", <component>...}``."""
    [result] = _client(url, spec, api_key).score([_item(data_source, solution_str, ground_truth, extra_info)])
    return _as_dict(result, on_error)


def compute_score_batch(data_sources: list[Any], solution_strs: list[str], ground_truths: list[Any],
                        extra_infos: list[Any] | None = None, *, spec: str | None = None, url: str | None = None,
                        api_key: str | None = None, on_error: str | float = "raise",
                        **kwargs: Any) -> list[dict[str, Any]]:
    """verl's batch reward manager signature: the whole batch in one request (chunked), scored concurrently."""
    extras = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    items = [_item(*row) for row in zip(data_sources, solution_strs, ground_truths, extras, strict=True)]
    return [_as_dict(r, on_error) for r in _client(url, spec, api_key).score(items)]

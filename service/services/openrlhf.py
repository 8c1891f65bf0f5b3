"""OpenRLHF's remote reward-model protocol on top of synchronous scoring.

OpenRLHF posts ``{"query": [prompt + response, special tokens included], "prompts": [...], "labels":
[...]}`` and reads ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``, floats only. The response
is the text after the prompt, with padding and end-of-sequence tokens removed; a label becomes
``reference.answer`` (a dict label is the whole reference).

When an item cannot be scored (any component errored, or the prompt is not inside the query) the
deployment setting ``openrlhf_on_error`` decides: ``fail`` answers 503 (OpenRLHF's client retries, then
stops the run) and ``value`` substitutes ``openrlhf_error_value`` and flags the item in
``extra_logs["reward_error"]`` (1.0 per substituted item), so the substitution is visible in its logs.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy.orm import Session

from reward_models.scoring import Scorer
from service.errors import BadRequest, ServiceError
from service.integration_schemas import OpenRLHFIn, OpenRLHFOut, ScoreIn, ScoreResult
from service.services.score import score_items

OnError = Literal["fail", "value"]
# end-of-sequence / padding markers of common chat templates, removed from the end of a response
SPECIAL_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<eos>",
                  "<end_of_turn>", "<|end|>", "<pad>", "<|end▁of▁sentence|>")


class RewardUnavailable(ServiceError):
    status_code = 503


def split_response(query: str, prompt: str) -> str | None:
    """The response inside ``query`` (the text after the last occurrence of ``prompt``), trailing special
    tokens and whitespace removed; None when the prompt is not in the query."""
    at = query.rfind(prompt) if prompt else -1
    if at < 0:
        return None
    response = query[at + len(prompt):].rstrip()
    stripped = True
    while stripped:
        stripped = False
        for token in SPECIAL_TOKENS:
            if response.endswith(token):
                response, stripped = response[: -len(token)].rstrip(), True
    return response


def _reference(label: Any) -> dict[str, Any]:
    if label is None:
        return {}
    return dict(label) if isinstance(label, dict) else {"answer": label}


def _check(body: OpenRLHFIn) -> tuple[list[str], list[Any]]:
    n = len(body.query)
    if body.prompts is None or len(body.prompts) != n:
        raise BadRequest(f"prompts: expected {n} prompts (one per query), got "
                         f"{'none' if body.prompts is None else len(body.prompts)}")
    labels = body.labels if body.labels is not None else [None] * n
    if len(labels) != n:
        raise BadRequest(f"labels: expected {n} labels (one per query), got {len(labels)}")
    return body.prompts, labels


def get_reward(session: Session, scorer: Scorer, spec: str, body: OpenRLHFIn, *, on_error: OnError,
               error_value: float, max_items: int) -> OpenRLHFOut:
    prompts, labels = _check(body)
    responses = [split_response(q, p) for q, p in zip(body.query, prompts, strict=True)]
    scorable = [i for i, r in enumerate(responses) if r is not None]
    results: dict[int, ScoreResult] = {}
    if scorable:
        items = [{"prompt": prompts[i], "completion": responses[i], "reference": _reference(labels[i])}
                 for i in scorable]
        out = score_items(session, scorer, ScoreIn.model_validate({"reward_spec": spec, "items": items}), max_items)
        results = dict(zip(scorable, out.results, strict=True))
    failed = [i for i in range(len(body.query)) if i not in results or results[i].total is None]
    if failed and on_error == "fail":
        raise RewardUnavailable(f"query[{failed[0]}]: could not be scored ({_why(results.get(failed[0]))}); "
                                f"{len(failed)} of {len(body.query)} items failed", detail={"failed": failed})
    return _answer(len(body.query), results, set(failed), error_value)


def _why(result: ScoreResult | None) -> str:
    if result is None:
        return "the prompt is not part of the query"
    return "; ".join(f"{name}: {c.error}" for name, c in result.rewards.items() if c.error)


def _answer(n: int, results: dict[int, ScoreResult], failed: set[int], error_value: float) -> OpenRLHFOut:
    rewards = [error_value if i in failed else _total(results[i]) for i in range(n)]
    logs: dict[str, list[float]] = {"reward_error": [float(i in failed) for i in range(n)]}
    names = sorted({name for r in results.values() for name in r.rewards})
    for name in names:
        logs[name] = [_value(results.get(i), name, error_value) for i in range(n)]
    return OpenRLHFOut(rewards=rewards, scores=list(rewards), extra_logs=logs)


def _total(result: ScoreResult) -> float:
    if result.total is None:  # unreachable: such an item is in ``failed``
        raise AssertionError("an unscored item reached the answer")
    return result.total


def _value(result: ScoreResult | None, name: str, error_value: float) -> float:
    if result is None or name not in result.rewards or result.rewards[name].value is None:
        return error_value
    return float(result.rewards[name].value)

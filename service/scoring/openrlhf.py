"""OpenRLHF's remote reward-model protocol on top of synchronous scoring.

OpenRLHF posts ``{"query": [prompt + response, special tokens included], "prompts": [...], "labels":
[...]}`` and reads ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``, floats only. The response
is the text after the prompt at the start of the query, with padding and end-of-sequence tokens removed;
a query with no end-of-sequence token is scored as truncated (``finish_reason: length``) unless the setting
``openrlhf_eos_means_stop`` is off; a label becomes ``reference.answer`` (a dict label is the whole reference).

A query that does not start with its prompt is the caller's mistake: 422 naming ``query[i]``. When an item
cannot be scored (any component errored) the
deployment setting ``openrlhf_on_error`` decides: ``fail`` answers 503 (OpenRLHF's client retries, then
stops the run) and ``value`` substitutes ``openrlhf_error_value`` and flags the item in
``extra_logs["reward_error"]`` (1.0 per substituted item), so the substitution is visible in its logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.orm import Session

from service.api.errors import BadRequest, ServiceError
from service.auth.service import OPEN, Principal
from service.scoring.schemas import OpenRLHFIn, OpenRLHFOut, ScoreIn, ScoreResult
from service.scoring.service import ScoreRun, score_items

OnError = Literal["fail", "value"]
# end-of-sequence markers of common chat templates: a response that ends in one stopped by itself
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<eos>", "<end_of_turn>",
              "<|end|>", "<|end▁of▁sentence|>", "<｜end▁of▁sentence｜>")
# padding and beginning-of-sequence markers, removed around the query before the prompt is located
PAD_TOKENS = ("<pad>", "<|pad|>", "<|finetune_right_pad_id|>", "<unk>")
BOS_TOKENS = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<｜begin▁of▁sentence｜>")


class RewardUnavailable(ServiceError):
    status_code = 503


@dataclass(frozen=True, slots=True)
class Response:
    """The policy's part of a query, and whether it ended with an end-of-sequence token."""

    text: str
    ended: bool


def _lstrip_tokens(text: str, tokens: tuple[str, ...]) -> str:
    stripped = True
    while stripped:
        stripped = False
        for token in tokens:
            if text.startswith(token):
                text, stripped = text[len(token):], True
    return text


def _rstrip_tokens(text: str, tokens: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` without trailing ``tokens`` (and whitespace); whether any was removed."""
    text, removed, stripped = text.rstrip(), False, True
    while stripped:
        stripped = False
        for token in tokens:
            if text.endswith(token):
                text, stripped, removed = text[: -len(token)].rstrip(), True, True
    return text, removed


def split_response(query: str, prompt: str) -> Response | None:
    """The response inside ``query``: OpenRLHF's query is the prompt followed by the response, so the
    response is everything after the prompt at the START of the query (leading pad / BOS / EOS tokens
    skipped), never after a later copy the policy wrote itself. Trailing padding and end-of-sequence
    tokens are removed; ``ended`` says whether one was there. None when the query does not start with
    the prompt."""
    head = (PAD_TOKENS + BOS_TOKENS + END_TOKENS)
    prompt = _lstrip_tokens(prompt, head)
    if not prompt:
        return None
    body = _lstrip_tokens(query, head)
    if not body.startswith(prompt):
        return None
    text, _ = _rstrip_tokens(body[len(prompt):], PAD_TOKENS)
    text, ended = _rstrip_tokens(text, END_TOKENS + PAD_TOKENS)
    return Response(text, ended)


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


def _item(prompt: str, response: Response, label: Any, eos_means_stop: bool) -> dict[str, Any]:
    """A query without an end-of-sequence token hit the generation limit: scored as truncated."""
    finish = "stop" if response.ended or not eos_means_stop else "length"
    return {"prompt": prompt, "completion": response.text, "reference": _reference(label), "finish_reason": finish}


async def get_reward(session: Session, run: ScoreRun, spec: str, body: OpenRLHFIn, *, on_error: OnError,
                     error_value: float, eos_means_stop: bool = True, key: Principal = OPEN,
                     extra_logs: Literal["lists", "omit"] = "lists") -> OpenRLHFOut:
    """A label is the caller's reference: for a spec that runs its reference as code it is refused unless
    ``key`` may supply one (``service.specs.references``; the error names ``labels[i]``)."""
    prompts, labels = _check(body)
    responses = [split_response(q, p) for q, p in zip(body.query, prompts, strict=True)]
    unsplit = [i for i, r in enumerate(responses) if r is None]
    if unsplit:  # the caller sent a query that is not prompt + response: its mistake, never a 5xx to retry
        raise BadRequest(f"query[{unsplit[0]}]: does not start with prompts[{unsplit[0]}] (OpenRLHF sends the "
                         f"prompt followed by the response); {len(unsplit)} of {len(responses)} queries",
                         detail={"field": f"query[{unsplit[0]}]", "queries": unsplit})
    items = {i: _item(prompts[i], r, labels[i], eos_means_stop) for i, r in enumerate(responses) if r is not None}
    results: dict[int, ScoreResult] = {}
    if items:
        index = list(items)
        request = ScoreIn.model_validate({"reward_spec": spec, "items": list(items.values())})
        out = await score_items(session, run, request, key, reference_field=lambda i: f"labels[{index[i]}]",
                                path="openrlhf")
        results = dict(zip(items, out.results, strict=True))
    failed = [i for i in range(len(body.query)) if i not in results or results[i].total is None]
    if failed and on_error == "fail":
        raise RewardUnavailable(f"query[{failed[0]}]: could not be scored ({_why(results.get(failed[0]))}); "
                                f"{len(failed)} of {len(body.query)} items failed", detail={"failed": failed})
    answer = _answer(len(body.query), results, set(failed), error_value)
    # the queries scored as cut off by the generation limit (no end-of-sequence token), for OpenRLHF's logs
    answer.extra_logs["truncated"] = [float(i in items and items[i]["finish_reason"] == "length")
                                      for i in range(len(body.query))]
    if extra_logs == "omit":  # OpenRLHF 0.8 torch.cat()s each value: JSON lists fail there, no key does not
        answer.extra_logs = None
    return answer


def _why(result: ScoreResult | None) -> str:
    if result is None:
        return "the query does not start with the prompt"
    return "; ".join(f"{name}: {c.error}" for name, c in result.rewards.items() if c.error)


def _answer(n: int, results: dict[int, ScoreResult], failed: set[int], error_value: float) -> OpenRLHFOut:
    rewards = [error_value if i in failed else _total(results[i]) for i in range(n)]
    logs: dict[str, list[float]] = {"reward_error": [float(i in failed) for i in range(n)]}
    names = sorted({name for r in results.values() for name in r.rewards})
    for name in names:
        logs[name] = [_value(results.get(i), name, error_value) for i in range(n)]
    return OpenRLHFOut(rewards=rewards, scores=list(rewards), extra_logs=logs, substituted=sorted(failed))


def _total(result: ScoreResult) -> float:
    if result.total is None:  # unreachable: such an item is in ``failed``
        raise AssertionError("an unscored item reached the answer")
    return result.total


def _value(result: ScoreResult | None, name: str, error_value: float) -> float:
    if result is None or name not in result.rewards or result.rewards[name].value is None:
        return error_value
    return float(result.rewards[name].value)

"""Synchronous scoring (``POST /v1/score``): the worker's components, pool and deadlines, answered inline.

``total`` is None whenever any component errored (``reward_models.spec.combine``): never a silent 0.
With ``store`` the items are also recorded as groups (one per distinct prompt + reference), which the
worker scores and curates like any other group.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from sqlalchemy.orm import Session

from reward_models.base import PromptInfo, Sample
from reward_models.scoring import Scorer
from reward_models.spec import RewardSpec, ScoredSample
from service.errors import BadRequest, ServiceError
from service.integration_schemas import ComponentScore, ScoreIn, ScoreItem, ScoreOut, ScoreResult
from service.schemas import GroupIn, Message
from service.services import ingest, specs


class TooManyItems(ServiceError):
    status_code = 413


def _messages(value: str | list[Message], role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return [m.model_dump(exclude_none=True) for m in value]


def _final_answer(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m["role"] == "assistant":
            return m["content"] if isinstance(m.get("content"), str) else ""
    return ""


def to_sample(item: ScoreItem) -> tuple[Sample, PromptInfo]:
    """A wire item -> what components see (``max_tokens`` travels in the sample's metadata)."""
    completion = _messages(item.completion, "assistant")
    metadata = dict(item.metadata)
    if item.max_tokens is not None:
        metadata.setdefault("max_tokens", item.max_tokens)
    sample = Sample(
        messages=completion,
        final_answer=_final_answer(completion),
        finish_reason=item.finish_reason,
        num_tokens=item.num_tokens or 0,
        num_turns=sum(1 for m in completion if m["role"] == "assistant") or 1,
        metadata=metadata,
    )
    prompt = PromptInfo(messages=_messages(item.prompt, "user"), reference=item.reference,
                        metadata={}, dataset=item.dataset)
    return sample, prompt


def result_of(scored: ScoredSample) -> ScoreResult:
    rewards = {name: ComponentScore(value=r.value, error=r.error, details=r.details)
               for name, r in scored.components.items()}
    return ScoreResult(total=scored.total, outcome=scored.outcome, rewards=rewards)


def score_items(session: Session, scorer: Scorer, body: ScoreIn, max_items: int,
                max_group_size: int = 1024) -> ScoreOut:
    if len(body.items) > max_items:
        raise TooManyItems(f"items: {len(body.items)} items exceed the limit of {max_items} per request")
    version = specs.resolve_reward_spec(session, body.reward_spec)
    spec = RewardSpec.model_validate(version.body)
    scored = scorer.score(spec, [to_sample(item) for item in body.items])
    stored = _store(session, body, version, max_group_size) if body.store else None
    return ScoreOut(spec_name=version.name, spec_version=version.version,
                    results=[result_of(s) for s in scored], stored_groups=stored)


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _store(session: Session, body: ScoreIn, version: specs.Versioned, max_group_size: int) -> list[str]:
    """Items grouped by (dataset, prompt, reference) -> idempotent groups scored by the named spec."""
    by_prompt: dict[str, list[ScoreItem]] = {}
    for item in body.items:
        key = _digest([item.dataset, _messages(item.prompt, "user"), item.reference])
        by_prompt.setdefault(key, []).append(item)
    largest = max(len(items) for items in by_prompt.values())
    if largest > max_group_size:
        raise BadRequest(f"items: {largest} items share one prompt; with store, a group holds at most {max_group_size}")
    groups = []
    for key, items in by_prompt.items():
        first = items[0]
        trajectories = [{"messages": _messages(i.completion, "assistant"), "finish_reason": i.finish_reason,
                         "num_tokens": i.num_tokens, "metadata": i.metadata,
                         "final_answer": _final_answer(_messages(i.completion, "assistant"))} for i in items]
        prompt = {"dataset": first.dataset, "messages": _messages(first.prompt, "user"),
                  "reference": first.reference, "reward_spec": f"{version.name}@{version.version}"}
        group_id = "score-" + _digest([key, body.policy_version, trajectories])
        groups.append(GroupIn.model_validate({
            "id": group_id, "prompt_id": f"score-{key}", "policy_version": body.policy_version,
            "prompt": prompt, "trajectories": trajectories,
            "sampling": {"max_tokens": first.max_tokens} if first.max_tokens else {},
        }))
    # no token ids are stored, so the sequence limit never applies; the group-size limit does
    acks = ingest.ingest_groups(session, groups, max_group_size=max_group_size, max_sequence_tokens=2**31,
                                batched=True)
    return [a.id for a in acks]

"""Synchronous scoring (``POST /v1/score``): the worker's components, pool and deadlines, answered inline.

``total`` is None whenever any component errored (``reward_models.spec.combine``): never a silent 0.
With ``store`` the items are also recorded as groups (one per distinct prompt + reference), which the
worker scores and curates like any other group; that needs a producer (or admin) key, recorded on the groups.

A request holds no database connection and no threadpool thread while it is scored: the spec is resolved in
one short transaction (ended before scoring), the scoring runs on the app's scoring threads and is awaited,
and ``store`` writes in a second short transaction. A slow item therefore delays only its own request.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from reward_models.base import PromptInfo, Sample
from reward_models.scoring import PoolBudget, PoolBudgetExceeded, Scorer
from reward_models.spec import RewardSpec, ScoredSample
from service.api.errors import BadRequest, Forbidden, ServiceError
from service.api.schemas import Message
from service.auth.service import OPEN, PRODUCER, Principal
from service.ingest import service as ingest
from service.ingest.schemas import GroupIn
from service.observability import metrics
from service.scoring.gate import ScoreGate
from service.scoring.schemas import ComponentScore, ScoreIn, ScoreItem, ScoreOut, ScoreResult
from service.settings import Settings
from service.specs import service as specs


class TooManyItems(ServiceError):
    """More items than one request may carry, or more pool time than one request may take."""

    status_code = 413


@dataclass(frozen=True, slots=True)
class ScoreLimits:
    """What one scoring request may take: items, items per stored group, and its share of the shared
    process pool (``pool_budget_s`` of wall time, ``pool_max_in_flight`` tasks at a time)."""

    max_items: int = 512
    max_group_size: int = 1024
    pool_budget_s: float = 120.0
    pool_max_in_flight: int = 2

    def budget(self, in_flight: int | None = None) -> PoolBudget:
        return PoolBudget(self.pool_budget_s, in_flight or self.pool_max_in_flight)

    @classmethod
    def of(cls, settings: Settings) -> ScoreLimits:
        in_flight = settings.score_pool_max_in_flight or 2 * settings.worker_processes
        return cls(settings.max_score_items, settings.max_group_size, settings.score_pool_budget_s, in_flight)


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
                        metadata=_prompt_metadata(item), dataset=item.dataset)
    return sample, prompt


def _prompt_metadata(item: ScoreItem) -> dict[str, Any]:
    return {"tools": item.tools} if item.tools is not None else {}


def result_of(scored: ScoredSample) -> ScoreResult:
    rewards = {name: ComponentScore(value=r.value, error=r.error, details=r.details)
               for name, r in scored.components.items()}
    return ScoreResult(total=scored.total, outcome=scored.outcome, rewards=rewards)


@dataclass(frozen=True, slots=True)
class ScoreRun:
    """What a scoring request runs on: the Scorer, the threads that wait on its pool, its limits, and the
    specs that accept caller references (``service.specs.references``)."""

    scorer: Scorer
    executor: Executor
    limits: ScoreLimits = field(default_factory=ScoreLimits)
    caller_specs: frozenset[str] = frozenset()
    gate: ScoreGate | None = None  # pool slots across requests, requests per key (service.scoring.gate)


def _items_field(i: int) -> str:
    return f"items[{i}].reference"


def _check_request(body: ScoreIn, limits: ScoreLimits, key: Principal) -> None:
    if len(body.items) > limits.max_items:
        raise TooManyItems(f"items: {len(body.items)} items exceed the limit of {limits.max_items} per request",
                           detail={"max_items": limits.max_items})
    if body.store and not (key.is_admin or key.role == PRODUCER):
        raise Forbidden(f"store: creating groups needs a producer key; role {key.role.value!r} may score "
                        "without store only")


def _resolve(session: Session, body: ScoreIn, key: Principal, caller_specs: frozenset[str],
             reference_field: Callable[[int], str]) -> tuple[specs.Versioned, RewardSpec]:
    """The spec, and the check of who supplies its references; ends the read transaction (COMMIT: nothing
    was written), so the request's pooled connection goes back before it is scored."""
    version = specs.resolve_reward_spec(session, body.reward_spec)
    spec = RewardSpec.model_validate(version.body)
    specs.check_caller_references(version.name, spec, key,
                                       [(reference_field(i), item.reference) for i, item in enumerate(body.items)],
                                       caller_specs)
    session.commit()
    return version, spec


def _pool_tasks(scorer: Scorer, spec: RewardSpec, items: list[tuple[Sample, PromptInfo]]) -> int:
    """How many tasks scoring ``items`` puts in the shared pool (the Scorer's own ``in_pool`` test)."""
    components = [scorer.component(c.kind, c.params) for c in spec.components]
    return sum(1 for component in components for s, p in items if component.in_pool(s, p))


async def _score(run: ScoreRun, spec: RewardSpec, body: ScoreIn, key: Principal) -> list[ScoredSample]:
    """The scorer on one of the scoring threads, awaited: the event loop and the threadpool stay free. With a
    gate, the key's count and (when the items put tasks in the pool) a window of pool slots are held until
    the scoring ends."""
    limits, gate = run.limits, run.gate
    who = key.name or "(auth off)"
    items = [to_sample(item) for item in body.items]
    slots = 0
    if gate is not None:
        gate.enter_key(who)  # 429 beyond the key's limit
        try:
            tasks = _pool_tasks(run.scorer, spec, items)
            if tasks:
                slots = gate.window(min(limits.pool_max_in_flight, tasks))
                await gate.take_slots(slots)
        except BaseException:
            gate.leave_key(who)
            raise
    try:
        future = run.executor.submit(run.scorer.score, spec, items, limits.budget(slots or None))
    except BaseException:
        if gate is not None:
            gate.leave_key(who)
            gate.give_slots(slots)
        raise
    if gate is not None:
        gate.release_when_done(future, who, slots)
    try:
        return await asyncio.wrap_future(future)
    except PoolBudgetExceeded as exc:
        raise TooManyItems(f"items: the request needed more of the shared process pool than one request may "
                           f"take ({exc}; score_pool_budget_s); send fewer items per request",
                           detail={"max_items": limits.max_items, "pool_budget_s": limits.pool_budget_s}) from None


async def score_items(session: Session, run: ScoreRun, body: ScoreIn, key: Principal = OPEN,
                      reference_field: Callable[[int], str] = _items_field, path: str = "score") -> ScoreOut:
    """Score ``body``'s items (and store them with ``store``); ``reference_field(i)`` names item i's
    reference in errors; ``path`` labels the component metrics (``score``, ``openrlhf``)."""
    _check_request(body, run.limits, key)
    version, spec = await run_in_threadpool(_resolve, session, body, key, run.caller_specs, reference_field)
    scored = await _score(run, spec, body, key)
    metrics.observe_components({c.name: c.kind for c in spec.components}, [s.components for s in scored], path=path)
    stored = None
    if body.store:
        stored = await run_in_threadpool(_store, session, body, version, run.limits.max_group_size, key,
                                         run.caller_specs)
    return ScoreOut(spec_name=version.name, spec_version=version.version,
                    results=[result_of(s) for s in scored], stored_groups=stored)


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _tools_key(item: ScoreItem) -> list[Any]:
    """The tools are part of the prompt (a group per distinct tool set); none leaves old group ids as they were."""
    return [item.tools] if item.tools is not None else []


def _store(session: Session, body: ScoreIn, version: specs.Versioned, max_group_size: int, key: Principal,
           caller_specs: frozenset[str]) -> list[str]:
    """Items grouped by (dataset, prompt, reference, max_tokens) -> idempotent groups scored by the named
    spec; the group id hashes everything stored (sampling included), so a different budget is a new group."""
    by_prompt: dict[tuple[str, int | None], list[ScoreItem]] = {}
    for item in body.items:
        digest = _digest([item.dataset, _messages(item.prompt, "user"), item.reference, *_tools_key(item)])
        by_prompt.setdefault((digest, item.max_tokens), []).append(item)
    largest = max(len(items) for items in by_prompt.values())
    if largest > max_group_size:
        raise BadRequest(f"items: {largest} items share one prompt; with store, a group holds at most {max_group_size}")
    groups = []
    for (digest, max_tokens), items in by_prompt.items():
        first = items[0]
        trajectories = [{"messages": _messages(i.completion, "assistant"), "finish_reason": i.finish_reason,
                         "num_tokens": i.num_tokens, "metadata": i.metadata,
                         "final_answer": _final_answer(_messages(i.completion, "assistant"))} for i in items]
        prompt = {"dataset": first.dataset, "messages": _messages(first.prompt, "user"),
                  "reference": first.reference, "reward_spec": f"{version.name}@{version.version}",
                  "metadata": _prompt_metadata(first)}
        sampling = {"max_tokens": max_tokens} if max_tokens else {}
        group_id = "score-" + _digest([digest, body.policy_version, sampling, trajectories])
        groups.append(GroupIn.model_validate({
            "id": group_id, "prompt_id": f"score-{digest}", "policy_version": body.policy_version,
            "prompt": prompt, "trajectories": trajectories, "sampling": sampling,
        }))
    # no token ids are stored, so the sequence limit never applies; the group-size limit does
    acks = ingest.ingest_groups(session, groups, max_group_size=max_group_size, max_sequence_tokens=2**31,
                                batched=True, key=key, caller_specs=caller_specs)
    return [a.id for a in acks]


# The worker's score stage (claimed groups, service.worker.pipeline) is this domain's too: it reaches it here.
from service.scoring.stage import Backoff, Job, ScoreOutcome, exhausted_decisions, prepare, write  # noqa: E402, F401
from service.scoring.stage import score as score_job  # noqa: E402, F401

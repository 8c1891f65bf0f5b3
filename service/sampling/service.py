"""What producers should sample next (``GET /v1/sampling/requests``): refill and curriculum.

Order of the answer, up to ``n`` items:
1. ``resample`` then ``resume``: open requests from the curation stage for a prompt whose members hit a
   budget, with the larger budget (highest priority first); a request that fills a slot of a waiting group
   names it (``group_id``, ``index``; a resume carries its ``checkpoint``, docs/curation.md "Remedies");
2. ``refill``: open requests to replace a group lost to filtering, so the trainer's batches stay full;
   each is resolved to a concrete prompt of its dataset by the curriculum (below);
3. ``new``: prompts never sampled, oldest first;
4. ``curriculum``: the best other prompts by the curriculum.

Curriculum: a prompt whose last k group outcome means were all solved / all failed gives zero-variance
groups (no GRPO signal; DAPO, Yu et al. 2025), so it gets its policy's ``curriculum.low_priority``
(``filters.curriculum.priority_for``, computed in SQL here); prompts are taken by priority, then fewest
curated groups, then least recently sampled. Priority 0 means never. The config comes from the prompt's
curation policy, else its dataset's, else the default policy.

With a ``producer_id`` the answer is claimed: rows are locked with ``FOR UPDATE SKIP LOCKED`` and marked
taken, and synthesized items (new / curriculum) are recorded as taken rows, so two producers never get the
same request nor the same prompt (choosing prompts holds a transaction-scoped advisory lock). A prompt
being sampled -- taken with a running lease, or with an open resample -- is not handed out again. Taken
requests not marked done within ``lease_seconds`` are available again (resample / refill rows are handed
out anew; a lapsed new / curriculum pick simply frees its prompt). Without a producer it is a peek.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from filters.policy import CurationPolicySpec
from filters.types import CurriculumConfig
from service.api.errors import NotFound
from service.sampling import repository as repo
from service.specs import service as specs
from service.store.models import Prompt, SamplingRequest

DEFAULT_LEASE_SECONDS = 600.0


@dataclass
class Pick:
    """One item of the answer; ``row`` is the stored request it comes from (None: synthesized)."""

    prompt_id: str
    dataset: str
    reason: str
    priority: float
    n: int | None = None
    budget: dict[str, Any] = field(default_factory=dict)
    row: SamplingRequest | None = None
    request_id: int | None = None


def _curriculum_of(
    session: Session, ref: str | None, cache: dict[str | None, CurriculumConfig]
) -> CurriculumConfig:
    """The curriculum config of a policy ref; None (or a ref that does not resolve): the default policy's."""
    if ref not in cache:
        body = None
        if ref is not None:
            try:
                body = specs.resolve_curation_policy(session, ref).body
            except NotFound:
                body = None
        if body is None:
            body = specs.default_policy_body(session)
        cache[ref] = CurationPolicySpec.model_validate(body).to_policy().curriculum
    return cache[ref]


def priority_expression(session: Session, dataset: str | None) -> tuple[str, dict[str, Any]]:
    """The SQL curriculum priority of every prompt (of ``dataset``, or all)."""
    cache: dict[str | None, CurriculumConfig] = {}
    branches: list[repo.Branch] = [
        ("policy", ref, _curriculum_of(session, ref, cache)) for ref in repo.prompt_policies(session, dataset)
    ]
    branches += [
        ("dataset", name, _curriculum_of(session, ref, cache))
        for name, ref in sorted(repo.dataset_policies(session, dataset).items())
    ]
    return repo.priority_sql(branches, _curriculum_of(session, None, cache))


def _refills(session: Session, rows: list[SamplingRequest], busy: set[str], priority: Any) -> list[Pick]:
    """Resolve refill rows to distinct free prompts of their datasets; rows left unresolved stay open."""
    picks: list[Pick] = []
    by_dataset: dict[str, list[SamplingRequest]] = {}
    for row in rows:
        by_dataset.setdefault(row.dataset, []).append(row)
    for dataset, members in by_dataset.items():
        ranked = repo.rank_prompts(session, priority, dataset, busy, len(members))
        for row, (prompt_id, _ds, _prio) in zip(members, ranked, strict=False):
            busy.add(prompt_id)
            picks.append(
                Pick(prompt_id, dataset, "refill", row.priority, row.n, dict(row.budget), row, row.pk)
            )
    return picks


def _choose(session: Session, n: int, dataset: str | None, cutoff: datetime, claim: bool) -> list[Pick]:
    """Up to ``n`` picks in answer order (see the module docstring)."""
    rows = repo.open_rows(session, "resample", n, dataset, cutoff, lock=claim)
    rows += repo.open_rows(session, "resume", n - len(rows), dataset, cutoff, lock=claim)
    picks = [
        Pick(r.prompt_id or "", r.dataset, r.reason, r.priority, r.n, dict(r.budget), r, r.pk) for r in rows
    ]
    if len(picks) >= n:
        return picks
    if claim:
        repo.lock_choices(session)
    busy = repo.in_flight_prompts(session, cutoff, dataset) | {p.prompt_id for p in picks}
    priority = priority_expression(session, dataset)
    refills = repo.open_rows(session, "refill", n - len(picks), dataset, cutoff, lock=claim)
    picks += _refills(session, refills, busy, priority)
    for prompt_id, ds in repo.never_sampled(session, dataset, busy, n - len(picks)):
        busy.add(prompt_id)
        picks.append(Pick(prompt_id, ds, "new", 1.0))
    for prompt_id, ds, prio in repo.rank_prompts(session, priority, dataset, busy, n - len(picks)):
        picks.append(Pick(prompt_id, ds, "curriculum", prio))
    return picks


def _fill_synthesized(session: Session, picks: list[Pick], group_size: int) -> None:
    """New / curriculum picks take the sampling params and group size of the prompt's last group."""
    synthesized = [p for p in picks if p.row is None]
    last = repo.last_groups(session, [p.prompt_id for p in synthesized])
    for p in synthesized:
        budget, size = last.get(p.prompt_id, ({}, group_size))
        p.budget, p.n = dict(budget), size


def _claim(session: Session, picks: list[Pick], producer_id: str, now: datetime) -> None:
    """Mark stored rows taken (refills with their resolved prompt) and record synthesized picks as taken."""
    repo.mark_taken(session, [(p.row.pk, p.prompt_id) for p in picks if p.row is not None], producer_id, now)
    synthesized = [p for p in picks if p.row is None]
    pks = repo.insert_taken(
        session,
        [
            {
                "prompt_id": p.prompt_id,
                "dataset": p.dataset,
                "reason": p.reason,
                "n": p.n,
                "budget": p.budget,
                "priority": p.priority,
                "status": "taken",
                "taken_by": producer_id,
                "taken_at": now,
            }
            for p in synthesized
        ],
    )
    for p, pk in zip(synthesized, pks, strict=True):
        p.request_id = pk


def _item(
    p: Pick, prompt: Prompt | None, expires: datetime | None, include_reference: bool,
    groups: dict[int, str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": prompt.messages if prompt else [],
        "metadata": prompt.metadata_ if prompt else {},
    }
    if include_reference:
        body["reference"] = prompt.reference if prompt else {}
    return {
        "request_id": p.request_id,
        "prompt_id": p.prompt_id,
        "dataset": p.dataset,
        "reason": p.reason,
        "n": p.n,
        "budget": p.budget,
        "priority": p.priority,
        "prompt": body,
        "expires_at": expires.isoformat() if expires else None,
        **_slot(p, groups or {}),
    }


def _slot(p: Pick, groups: dict[int, str]) -> dict[str, Any]:
    """A remedy in place names its group and slot; a resume carries its checkpoint."""
    row = p.row
    if row is None or row.idx is None or row.source_group_pk not in groups:
        return {}
    return {"group_id": groups[row.source_group_pk], "index": row.idx, "checkpoint": row.checkpoint}


def next_requests(
    session: Session,
    n: int,
    *,
    producer_id: str | None = None,
    dataset: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    group_size: int = 8,
    include_reference: bool = False,
) -> dict[str, Any]:
    """``{"requests": [...]}``: up to ``n`` things to sample, claimed for ``producer_id`` when given."""
    now = datetime.now(UTC)
    claim = producer_id is not None
    picks = _choose(session, n, dataset, now - timedelta(seconds=lease_seconds), claim)
    _fill_synthesized(session, picks, group_size)
    expires = None
    if producer_id is not None:
        _claim(session, picks, producer_id, now)
        expires = now + timedelta(seconds=lease_seconds)
    prompts = repo.prompts_by_id(session, {p.prompt_id for p in picks})
    groups = repo.slot_groups(session, [p.row.source_group_pk for p in picks
                                        if p.row is not None and p.row.idx is not None and p.row.source_group_pk])
    return {"requests": [_item(p, prompts.get(p.prompt_id), expires, include_reference, groups) for p in picks]}


def mark_done(session: Session, request_ids: list[int], datasets: frozenset[str] | None = None) -> dict[str, Any]:
    """Mark requests done (producers call it after posting the group); unknown ids are listed, and so
    are those outside ``datasets`` (a scoped key's)."""
    found = set(repo.mark_done(session, sorted(set(request_ids)), datasets))
    return {"done": sorted(found), "unknown": sorted(set(request_ids) - found)}

"""Scoring stage: claimed groups -> reward components -> stored rewards and totals.

Three steps, so no transaction is open while components run (LLM judges, sandboxes: seconds to minutes):
``prepare`` reads the claimed groups and resolves their specs (a short read), ``score`` calls the scorer
with no session at all, ``write`` stores the results in a short transaction fenced by the claim.

Failures are per group. A spec that cannot be resolved, and a spec that would run as code a reference no
admin key loaded (``service.specs.references``: the operator's configuration, never the model's), are final (``reward_error`` at once, with a decision
naming the cause). Component errors (judge down, sandbox crash, a non-finite value) are retried with
exponential backoff and jitter up to ``max_attempts``; after the last attempt the errors go on to curation,
where the policy's ``reward_error`` action decides (drop the member, or the group). A scorer that raises
for a whole spec is retried the same way and ends in ``reward_error``. An error is never turned into a 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from reward_models.base import PromptInfo, Sample
from reward_models.scoring import Scorer
from reward_models.spec import RewardSpec, ScoredSample
from service.curation import service as curation
from service.ingest import service as ingest
from service.observability import metrics
from service.scoring import repository as score_repo
from service.specs import service as specs
from service.store.db import db_now
from service.store.models import Group, Prompt, Trajectory

Resolved = tuple[specs.Versioned, RewardSpec]


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (1-based): ``uniform(0.5, 1) * min(max_s, base_s * 2**(n-1))``
    ("equal jitter": retries of groups that failed together spread out, and never wait less than half)."""

    base_s: float = 1.0
    max_s: float = 300.0

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        cap = min(self.max_s, self.base_s * 2 ** max(0, attempts - 1))
        return (rng or random).uniform(0.5, 1.0) * cap


@dataclass
class ScoreOutcome:
    scored: list[Group] = field(default_factory=list)
    retried: int = 0
    failed: int = 0
    fenced: int = 0  # results refused: the claim had expired and another worker took the group


@dataclass
class Job:
    """What one claim scores: the groups, their prompts, and each group's spec (or why it has none)."""

    token: str
    groups: list[Group]
    prompts: dict[str, Prompt]
    spec_of: dict[int, Resolved] = field(default_factory=dict)
    spec_error: dict[int, str] = field(default_factory=dict)
    results: dict[int, list[ScoredSample]] = field(default_factory=dict)
    score_error: dict[int, str] = field(default_factory=dict)


def sample_of(t: Trajectory) -> Sample:
    return Sample(
        messages=t.messages,
        final_answer=t.final_answer,
        finish_reason=t.finish_reason,
        num_tokens=t.num_tokens,
        num_turns=t.num_turns,
        metadata=t.metadata_,
    )


def prompt_info(p: Prompt) -> PromptInfo:
    return PromptInfo(messages=p.messages, reference=p.reference, metadata=p.metadata_, dataset=p.dataset)


def _spec_for(session: Session, g: Group, prompt: Prompt, cache: dict) -> Resolved:
    """A rescore pins the version on the group; otherwise the prompt's, dataset's or the default spec."""
    if g.reward_spec_name is not None and g.reward_spec_version is not None:
        key: Any = (g.reward_spec_name, g.reward_spec_version)
        if key not in cache:
            v = specs.resolve_reward_spec(session, f"{key[0]}@{key[1]}")
            cache[key] = (v, RewardSpec.model_validate(v.body))
        return cache[key]
    key = ("effective", prompt.reward_spec, prompt.dataset)
    if key not in cache:
        cache[key] = specs.effective_reward_spec(session, prompt.reward_spec, prompt.dataset)
    return cache[key]


def prepare(session: Session, token: str, pks: list[int], caller_specs: frozenset[str] = frozenset()) -> Job:
    """Read the claimed groups and resolve each one's spec; a group whose spec fails gets its error, and so
    does one whose spec would run as code a reference that no admin key loaded (unless the spec is one of
    ``caller_specs``, the deployment's opt-ins)."""
    groups = score_repo.load_groups(session, pks)
    job = Job(token, groups, ingest.prompts_by_id(session, {g.prompt_id for g in groups}))
    cache: dict = {}
    for g in groups:
        prompt = job.prompts[g.prompt_id]
        try:
            resolved = _spec_for(session, g, prompt, cache)
        except Exception as exc:  # a missing / invalid spec is this group's problem, not the batch's
            job.spec_error[g.pk] = f"reward spec: {exc}"[:2000]
            continue
        problem = specs.stored_reference_problem(resolved[0].name, resolved[1], prompt.id, prompt.reference,
                                                 prompt.reference_from_admin, caller_specs)
        if problem is not None:
            job.spec_error[g.pk] = problem[:2000]
        else:
            job.spec_of[g.pk] = resolved
    return job


def score(scorer: Scorer, job: Job) -> Job:
    """One scorer call per spec over all its groups' trajectories (keeps the pool busy); no session."""
    by_spec: dict[int, tuple[RewardSpec, list[Group]]] = {}
    for g in job.groups:
        if g.pk in job.spec_of:
            spec = job.spec_of[g.pk][1]
            by_spec.setdefault(id(spec), (spec, []))[1].append(g)
    for spec, members in by_spec.values():
        items = [(sample_of(t), prompt_info(job.prompts[g.prompt_id])) for g in members for t in g.trajectories]
        try:
            flat = iter(scorer.score(spec, items))
            for g in members:
                job.results[g.pk] = [next(flat) for _ in g.trajectories]
        except Exception as exc:  # the scorer itself failed: these groups retry, the others go on
            for g in members:
                job.results.pop(g.pk, None)
                job.score_error[g.pk] = f"scorer: {type(exc).__name__}: {exc}"[:2000]
    return job


def _reward_rows(g: Group, spec: specs.Versioned, kinds: dict[str, str], scored: list[ScoredSample]) -> list[dict]:
    return [
        {
            "group_pk": g.pk,
            "idx": t.idx,
            "spec_name": spec.name,
            "spec_version": spec.version,
            "component": name,
            "kind": kinds[name],
            "value": r.value,
            "details": r.details,
            "error": r.error,
            "latency_ms": r.latency_ms,
            "created_at": datetime.now(UTC),
        }
        for t, s in zip(g.trajectories, scored, strict=True)
        for name, r in s.components.items()
    ]


def _errors(scored: list[ScoredSample]) -> list[str]:
    return [f"[{i}] {name}: {r.error}" for i, s in enumerate(scored) for name, r in s.components.items() if r.error]


def _decision(g: Group, name: str | None, version: int | None, reason: str) -> dict:
    return {"group_pk": g.pk, "idx": None, "policy_name": name, "policy_version": version, "action": "drop",
            "rule": "reward_error", "reason": reason[:4000]}


class _Writes:
    """Rows of one batch of scored groups, written with one statement each."""

    def __init__(self, max_attempts: int, backoff: Backoff, now: datetime | None = None) -> None:
        self.max_attempts, self.backoff = max_attempts, backoff
        self.now = now or datetime.now(UTC)  # the database's clock (write): retry_at is compared with it
        self.rewards: list[dict] = []
        self.scores: list[tuple[int, int, float | None, float | None]] = []
        self.groups: list[dict] = []
        self.decisions: list[dict] = []
        self.outcome = ScoreOutcome()

    def _row(self, g: Group, **values: Any) -> dict:
        row = {"pk": g.pk, "reward_spec_name": g.reward_spec_name, "reward_spec_version": g.reward_spec_version,
               "score_error": None, "status": "scored", "retry_at": None, "scored_at": self.now,
               "drop_reason": None, "claimed_by": None, "claimed_until": None}
        row.update(values)
        self.groups.append(row)
        return row

    def fail(self, g: Group, error: str) -> None:
        """Final: the group cannot be scored (spec missing, attempts used up)."""
        self._row(g, status="reward_error", drop_reason="reward_error", score_error=error[:4000], scored_at=None)
        self.decisions.append(_decision(g, g.reward_spec_name, g.reward_spec_version,
                                        f"scoring failed after {g.score_attempts} attempt(s): {error}"))
        self.outcome.failed += 1

    def retry(self, g: Group, error: str, **values: Any) -> None:
        when = self.now + timedelta(seconds=self.backoff.delay(g.score_attempts))
        self._row(g, status="received", retry_at=when, scored_at=None, score_error=error[:4000], **values)
        self.outcome.retried += 1

    def add(self, g: Group, version: specs.Versioned, spec: RewardSpec, scored: list[ScoredSample]) -> None:
        self.rewards += _reward_rows(g, version, {c.name: c.kind for c in spec.components}, scored)
        metrics.observe_components({c.name: c.kind for c in spec.components}, [s.components for s in scored])
        errors = "; ".join(_errors(scored))
        pinned = {"reward_spec_name": version.name, "reward_spec_version": version.version}
        if errors and g.score_attempts < self.max_attempts:
            self.retry(g, errors, **pinned)
            return
        # clean, or the last attempt: members with errors keep total None and curation's
        # reward_error action decides what happens to them
        self._row(g, score_error=errors[:4000] or None, **pinned)
        for t, s in zip(g.trajectories, scored, strict=True):
            self.scores.append((g.pk, t.idx, s.total, s.outcome))
            # the bulk UPDATE writes the row; keep the loaded object in step without dirtying it
            set_committed_value(t, "total_reward", s.total)
            set_committed_value(t, "outcome", s.outcome)
        self.outcome.scored.append(g)

    def flush(self, session: Session) -> ScoreOutcome:
        score_repo.upsert_rewards(session, self.rewards)
        score_repo.update_trajectory_scores(session, self.scores)
        ingest.update_groups(session, self.groups)
        curation.record_decisions(session, self.decisions)
        return self.outcome


def write(session: Session, job: Job, max_attempts: int, backoff: Backoff) -> ScoreOutcome:
    """Store the job's results for the groups still claimed by it (the others are counted ``fenced``)."""
    held = score_repo.lock_claimed(session, [g.pk for g in job.groups], job.token)
    writes = _Writes(max_attempts, backoff, db_now(session))  # the database's clock, not this worker's
    for g in job.groups:
        if g.pk not in held:
            writes.outcome.fenced += 1
        elif g.pk in job.spec_error:
            writes.fail(g, job.spec_error[g.pk])
        elif g.pk in job.score_error:
            if g.score_attempts < max_attempts:
                writes.retry(g, job.score_error[g.pk])
            else:
                writes.fail(g, job.score_error[g.pk])
        else:
            writes.add(g, *job.spec_of[g.pk], job.results[g.pk])
    return writes.flush(session)


def exhausted_decisions(session: Session, rows: list[tuple[int, int]]) -> None:
    """Decision-log rows for groups whose attempts all ended without a result (the worker's ``fail_exhausted``)."""
    curation.record_decisions(session, [
        {"group_pk": pk, "idx": None, "policy_name": None, "policy_version": None, "action": "drop",
         "rule": "reward_error", "reason": f"scoring did not finish in {n} attempt(s) (worker crashed or hung)"}
        for pk, n in rows
    ])

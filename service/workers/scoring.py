"""Scoring stage: claimed groups -> reward components -> stored rewards and totals.

A component failure is stored as an error (never a 0). A group with any error is retried with backoff up
to ``max_attempts``; then it is marked ``reward_error`` (its totals stay unset) and a refill is requested.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from reward_models.base import PromptInfo, Sample
from reward_models.scoring import Scorer
from reward_models.spec import RewardSpec, ScoredSample
from service import metrics
from service.models import Group, Prompt, Trajectory
from service.repositories import pipeline as repo
from service.services import specs


@dataclass
class ScoreOutcome:
    scored: list[Group]
    retried: int
    failed: int


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


def _spec_for(session: Session, g: Group, prompt: Prompt, cache: dict) -> tuple[specs.Versioned, RewardSpec]:
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


def _score_all(scorer: Scorer, groups: list[Group], spec_of: dict[int, tuple[specs.Versioned, RewardSpec]],
               prompts: dict[str, Prompt]) -> dict[int, list[ScoredSample]]:
    """One scorer call per spec over all its groups' trajectories (keeps the pool busy) -> pk -> results."""
    by_spec: dict[int, tuple[RewardSpec, list[Group]]] = {}
    for g in groups:
        spec = spec_of[g.pk][1]
        by_spec.setdefault(id(spec), (spec, []))[1].append(g)
    results: dict[int, list[ScoredSample]] = {}
    for spec, members in by_spec.values():
        items = [(sample_of(t), prompt_info(prompts[g.prompt_id])) for g in members for t in g.trajectories]
        flat = iter(scorer.score(spec, items))
        for g in members:
            results[g.pk] = [next(flat) for _ in g.trajectories]
    return results


class _Writes:
    """Rows of one batch of scored groups, written with one statement each."""

    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts
        self.rewards: list[dict] = []
        self.scores: list[tuple[int, int, float | None, float | None]] = []
        self.groups: list[dict] = []
        self.decisions: list[dict] = []
        self.outcome = ScoreOutcome([], 0, 0)

    def add(self, g: Group, version: specs.Versioned, spec: RewardSpec, scored: list[ScoredSample]) -> None:
        self.rewards += _reward_rows(g, version, {c.name: c.kind for c in spec.components}, scored)
        metrics.observe_components({c.name: c.kind for c in spec.components}, [s.components for s in scored])
        errors = _errors(scored)
        attempts = g.score_attempts + 1
        row = {"pk": g.pk, "reward_spec_name": version.name, "reward_spec_version": version.version,
               "score_attempts": attempts, "score_error": "; ".join(errors)[:4000] or None,
               "status": "scored", "retry_at": None, "scored_at": datetime.now(UTC), "drop_reason": None}
        if not errors:
            for t, s in zip(g.trajectories, scored, strict=True):
                self.scores.append((g.pk, t.idx, s.total, s.outcome))
                # the bulk UPDATE writes the row; keep the loaded object in step without dirtying it
                set_committed_value(t, "total_reward", s.total)
                set_committed_value(t, "outcome", s.outcome)
            self.outcome.scored.append(g)
        elif attempts < self.max_attempts:
            row.update(status="received", retry_at=repo.backoff_until(attempts), scored_at=None)
            self.outcome.retried += 1
        else:
            row.update(status="reward_error", drop_reason="reward_error")
            self.decisions.append({"group_pk": g.pk, "idx": None, "policy_name": version.name,
                                   "policy_version": version.version, "action": "drop", "rule": "reward_error",
                                   "reason": f"scoring failed {attempts} times: {row['score_error']}"[:4000]})
            self.outcome.failed += 1
        self.groups.append(row)

    def flush(self, session: Session) -> ScoreOutcome:
        repo.upsert_rewards(session, self.rewards)
        repo.update_trajectory_scores(session, self.scores)
        repo.update_groups(session, self.groups)
        repo.insert_decisions(session, self.decisions)
        return self.outcome


def score_groups(session: Session, scorer: Scorer, groups: list[Group], max_attempts: int) -> ScoreOutcome:
    """Score every trajectory of ``groups`` (already locked by the caller) and write the results."""
    prompts = repo.prompts_by_id(session, {g.prompt_id for g in groups})
    cache: dict = {}
    spec_of = {g.pk: _spec_for(session, g, prompts[g.prompt_id], cache) for g in groups}
    results = _score_all(scorer, groups, spec_of, prompts)
    writes = _Writes(max_attempts)
    for g in groups:
        writes.add(g, *spec_of[g.pk], results[g.pk])
    return writes.flush(session)

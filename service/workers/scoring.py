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


def score_groups(session: Session, scorer: Scorer, groups: list[Group], max_attempts: int) -> ScoreOutcome:
    """Score every trajectory of ``groups`` (already locked by the caller) and write the results."""
    prompts = repo.prompts_by_id(session, {g.prompt_id for g in groups})
    cache: dict = {}
    reward_rows: list[dict] = []
    score_rows: list[tuple[int, int, float | None, float | None]] = []
    group_rows: list[dict] = []
    decisions: list[dict] = []
    outcome = ScoreOutcome([], 0, 0)
    by_spec: dict[int, tuple[specs.Versioned, RewardSpec, list[Group]]] = {}
    for g in groups:
        version, spec = _spec_for(session, g, prompts[g.prompt_id], cache)
        by_spec.setdefault(id(spec), (version, spec, []))[2].append(g)
    results: dict[int, list[ScoredSample]] = {}
    for _version, spec, members in by_spec.values():  # one scorer call per spec: the pool stays busy
        items = [(sample_of(t), prompt_info(prompts[g.prompt_id])) for g in members for t in g.trajectories]
        flat = iter(scorer.score(spec, items))
        for g in members:
            results[g.pk] = [next(flat) for _ in g.trajectories]
    for g in groups:
        version, spec = _spec_for(session, g, prompts[g.prompt_id], cache)
        scored = results[g.pk]
        kinds = {c.name: c.kind for c in spec.components}
        reward_rows += _reward_rows(g, version, kinds, scored)
        errors = _errors(scored)
        row = {"pk": g.pk, "reward_spec_name": version.name, "reward_spec_version": version.version,
               "score_attempts": g.score_attempts + 1, "score_error": "; ".join(errors)[:4000] or None,
               "status": "scored", "retry_at": None, "scored_at": datetime.now(UTC), "drop_reason": None}
        if not errors:
            for t, s in zip(g.trajectories, scored, strict=True):
                score_rows.append((g.pk, t.idx, s.total, s.outcome))
                # the bulk UPDATE below writes the row; keep the loaded object in step without dirtying it
                set_committed_value(t, "total_reward", s.total)
                set_committed_value(t, "outcome", s.outcome)
            outcome.scored.append(g)
        elif g.score_attempts + 1 < max_attempts:
            row.update(status="received", retry_at=repo.backoff_until(g.score_attempts + 1), scored_at=None)
            outcome.retried += 1
        else:
            row.update(status="reward_error", drop_reason="reward_error")
            decisions.append({"group_pk": g.pk, "idx": None, "policy_name": version.name,
                              "policy_version": version.version, "action": "drop", "rule": "reward_error",
                              "reason": f"scoring failed {max_attempts} times: {row['score_error']}"[:4000]})
            outcome.failed += 1
        group_rows.append(row)
    repo.upsert_rewards(session, reward_rows)
    repo.update_trajectory_scores(session, score_rows)
    repo.update_groups(session, group_rows)
    repo.insert_decisions(session, decisions)
    return outcome

"""Curation stage: scored groups -> per-trajectory action, reason and advantage; group ready or dropped.

Pure decisions come from ``filters.curate_groups``; this module reads their inputs from PostgreSQL and
writes their results back in bulk: trajectory advantages / actions, group status, a decision-log entry for
every drop, mask, penalty or resample, refill / resample requests for producers, prompt pass rates.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from filters import curate_groups
from filters.types import CurationPolicy, GroupDecision, GroupScore, TrajectoryScore
from service.models import Group
from service.repositories import pipeline as repo
from service.repositories import policy as policy_repo
from service.services import specs, stats

_PLAIN_METRICS = ("outcome", "total")


def _policy_for(session: Session, g: Group, prompts: dict, cache: dict) -> tuple[specs.Versioned, CurationPolicy]:
    if g.curation_policy_name is not None and g.curation_policy_version is not None:
        key: Any = (g.curation_policy_name, g.curation_policy_version)
        if key not in cache:
            from filters.policy import CurationPolicySpec

            v = specs.resolve_curation_policy(session, f"{key[0]}@{key[1]}")
            cache[key] = (v, CurationPolicySpec.model_validate(v.body).to_policy())
        return cache[key]
    prompt = prompts[g.prompt_id]
    key = ("effective", prompt.curation_policy, prompt.dataset)
    if key not in cache:
        cache[key] = specs.effective_policy(session, prompt.curation_policy, prompt.dataset)
    return cache[key]


def _group_score(g: Group, components: dict[tuple[int, int], dict[str, float | None]]) -> GroupScore:
    max_tokens = g.sampling.get("max_tokens") if isinstance(g.sampling, dict) else None
    return GroupScore(
        group_id=g.id,
        policy_version=g.policy_version,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        trajectories=[
            TrajectoryScore(
                index=t.idx,
                finish_reason=t.finish_reason,
                total=t.total_reward,
                components=components.get((g.pk, t.idx), {}),
                outcome=t.outcome,
                num_tokens=t.num_tokens,
            )
            for t in g.trajectories
        ],
    )


def _rule(reason: str) -> str:
    return reason.split(":", 1)[0]


class _Writes:
    """Rows collected over a batch of groups, written with one statement each."""

    def __init__(self) -> None:
        self.trajectories: list[tuple[int, int, float, str, str]] = []
        self.groups: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.outcomes: list[tuple[str, float]] = []
        self.set_aside_pks: set[int] = set()

    def add(self, g: Group, d: GroupDecision, policy: specs.Versioned, dataset: str) -> None:
        now = datetime.now(UTC)
        log = {"group_pk": g.pk, "policy_name": policy.name, "policy_version": policy.version}
        for t in d.trajectories:
            self.trajectories.append((g.pk, t.index, t.advantage, t.action, t.reason))
            if t.action != "keep":
                self.decisions.append({**log, "idx": t.index, "action": t.action, "rule": _rule(t.reason), "reason": t.reason})
        if d.status == "dropped":
            self.decisions.append({**log, "idx": None, "action": "drop", "rule": _rule(d.drop_reason or "dropped"),
                                   "reason": d.drop_reason or "dropped"})
            self.requests.append({"prompt_id": None, "dataset": dataset, "reason": "refill", "n": len(g.trajectories),
                                  "budget": dict(g.sampling), "priority": 1.0, "source_group_pk": g.pk})
        if d.resample:
            budget = {**g.sampling, "max_tokens": d.resample_max_tokens} if d.resample_max_tokens else dict(g.sampling)
            self.requests.append({"prompt_id": g.prompt_id, "dataset": dataset, "reason": "resample",
                                  "n": len(d.resample), "budget": budget, "priority": 2.0, "source_group_pk": g.pk})
        if d.outcome_mean is not None:
            self.outcomes.append((g.prompt_id, d.outcome_mean))
        self.groups.append({"pk": g.pk, "status": d.status, "drop_reason": d.drop_reason,
                            "curation_policy_name": policy.name, "curation_policy_version": policy.version,
                            "metric_std": d.metric_std, "outcome_mean": d.outcome_mean, "curated_at": now,
                            "ready_at": now if d.status == "ready" else None})

    def set_aside(self, g: Group, error: str, policy: specs.Versioned) -> None:
        """A group curation cannot decide (a stored reward that is not finite): reward_error, logged, and
        not curated (``curated_at`` unset), so the reward statistics never see its values."""
        self.decisions.append({"group_pk": g.pk, "policy_name": policy.name, "policy_version": policy.version,
                               "idx": None, "action": "drop", "rule": "reward_error",
                               "reason": f"reward_error: cannot curate: {error}"[:4000]})
        self.groups.append({"pk": g.pk, "status": "reward_error", "drop_reason": "reward_error",
                            "curation_policy_name": policy.name, "curation_policy_version": policy.version,
                            "metric_std": None, "outcome_mean": None, "curated_at": None, "ready_at": None})
        self.set_aside_pks.add(g.pk)

    def flush(self, session: Session) -> None:
        repo.update_trajectory_decisions(session, self.trajectories)
        repo.update_groups(session, self.groups)
        repo.insert_decisions(session, self.decisions)
        repo.insert_sampling_requests(session, self.requests)
        repo.record_outcomes(session, self.outcomes)


def _decide(scores: list[GroupScore], policy: CurationPolicy, current: int | None) -> list[GroupDecision | str]:
    """The batch's decisions; when the batch is refused (a stored value is not finite), each group is
    decided alone and the ones refused come back as their error, so one bad group never stalls the rest."""
    try:
        return list(curate_groups(scores, policy, current))
    except ValueError:
        pass
    out: list[GroupDecision | str] = []
    for score in scores:
        try:
            out += curate_groups([score], policy, current)
        except ValueError as exc:
            out.append(str(exc))
    return out


def curate(session: Session, groups: list[Group]) -> dict[str, int]:
    """Curate ``groups`` (locked by the caller, status 'scored'); returns counts by resulting status."""
    if not groups:
        return {}
    prompts = repo.prompts_by_id(session, {g.prompt_id for g in groups})
    current = policy_repo.current_version(session)
    cache: dict = {}
    by_policy: dict[int, tuple[specs.Versioned, CurationPolicy, list[Group]]] = {}
    for g in groups:
        v, policy = _policy_for(session, g, prompts, cache)
        by_policy.setdefault(id(policy), (v, policy, []))[2].append(g)
    writes = _Writes()
    counts: dict[str, int] = {}
    for version, policy, members in by_policy.values():
        components: dict = {}
        if policy.zero_variance.metric not in _PLAIN_METRICS:
            for spec_key in {(g.reward_spec_name, g.reward_spec_version) for g in members}:
                components.update(repo.trajectory_components(session, [g.pk for g in members], spec_key))
        decisions = _decide([_group_score(g, components) for g in members], policy, current)
        for g, d in zip(members, decisions, strict=True):
            if isinstance(d, str):
                writes.set_aside(g, d, version)
                status = "reward_error"
            else:
                writes.add(g, d, version, prompts[g.prompt_id].dataset)
                status = d.status
            counts[status] = counts.get(status, 0) + 1
    writes.flush(session)
    stats.record_groups(session, [g.pk for g in groups if g.pk not in writes.set_aside_pks])  # pre-aggregated reward statistics
    return counts

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
from filters.rules import finish_reason_action, staleness_version
from filters.types import (
    REMEDY_ACTIONS,
    TRAINED_ACTIONS,
    CurationPolicy,
    GroupDecision,
    GroupScore,
    TrajectoryScore,
)
from service.curation import remedies
from service.curation import repository as curate_repo
from service.ingest import service as ingest
from service.policy import service as policy_service
from service.specs import service as specs
from service.stats import service as stats
from service.store import arrays
from service.store.db import db_now
from service.store.models import Group

_PLAIN_METRICS = ("outcome", "total")
# groups dropped for one of these add nothing to their prompt's recent outcomes (too few members to say)
NO_OUTCOME_DROPS = ("below_min_group_size",)
# the rule of a member's decision when its group was sent back by a rescore / recurate (no new rollouts)
NO_NEW_ROLLOUTS = "no_new_rollouts"
SENT_BACK = ("rescore", "recurate")  # the rules of the decision rows that mark a curated group sent back


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


def trained_segments(t: Any) -> int | None:
    """How many of a segmented trajectory's segments the trainer trains on (a mask-1 target: a mask-1 token
    after the segment's first), the K of ``divide`` (filters.segments); None when it is not segmented."""
    if not t.segments:
        return None
    mask = arrays.decode_list(t.loss_mask, arrays.MASK_DTYPE) or []
    count, start = 0, 0
    for seg in t.segments:
        n = int(seg.get("length") or 0) if isinstance(seg, dict) else 0
        count += any(mask[start + 1 : start + n])
        start += n
    return count


def _int_budget(sampling: Any) -> int | None:
    max_tokens = sampling.get("max_tokens") if isinstance(sampling, dict) else None
    return max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None


def member_budgets(history: remedies.SlotHistory) -> dict[tuple[int, int], int]:
    """(group pk, index) -> the max_tokens a slot's replacement was sampled with (its newest filled request's
    budget): a resampled member is shaped against the larger budget it was asked for, not its group's."""
    out: dict[tuple[int, int], int] = {}
    for slot, requests in history.items():
        filled = [r for r in requests if r.filled_at is not None]
        budget = _int_budget(filled[-1].budget) if filled else None
        if budget is not None:
            out[slot] = budget
    return out


def training_version(g: Group, policy: CurationPolicy) -> int:
    """The version ``g``'s staleness is measured from under ``policy``: ``staleness_version`` over the members
    that will train (their finish_reason's action is keep or penalize). A cut or failed member trains
    nothing, so its tokens' versions never decide its completers' fate. Reads the ``versions`` column only
    (of each member, its oldest generated token's version: all the rule needs); a member without versions has
    every generated token at the group's policy_version."""
    versions = [_oldest_generated(t.versions) for t in g.trajectories
                if t.versions is not None and _action(t.finish_reason, policy) in (*TRAINED_ACTIONS, None)]
    return staleness_version(versions, g.policy_version)


def _oldest_generated(raw: bytes) -> list[int]:
    """A member's stored versions (T,) -> [its oldest generated token's version] ([] when it generated none):
    all ``staleness_version`` takes from it (the minimum of its versions >= 0), without a Python loop over T."""
    versions = arrays.decode(raw, arrays.VERSION_DTYPE)
    generated = versions[versions >= 0] if versions is not None else None
    return [int(generated.min())] if generated is not None and generated.size else []


def _action(finish_reason: str, policy: CurationPolicy) -> str | None:
    """``finish_reason_action``; None for a reason the policy does not know (curate_groups then refuses the
    group by name: curation_error)."""
    try:
        return finish_reason_action(finish_reason, policy)
    except ValueError:
        return None


def _group_score(g: Group, components: dict[tuple[int, int], dict[str, float | None]],
                 budgets: dict[tuple[int, int], int] | None = None, version: int | None = None) -> GroupScore:
    max_tokens = _int_budget(g.sampling)
    budgets = budgets or {}
    return GroupScore(
        group_id=g.id,
        policy_version=g.policy_version if version is None else version,  # staleness: its training members'
        max_tokens=max_tokens,
        trajectories=[
            TrajectoryScore(
                index=t.idx,
                finish_reason=t.finish_reason,
                total=t.total_reward,
                components=components.get((g.pk, t.idx), {}),
                outcome=t.outcome,
                num_tokens=t.num_tokens,
                num_turns=t.num_turns,
                max_tokens=budgets.get((g.pk, t.idx)),
                segments=len(t.segments or ()),
                trained_segments=trained_segments(t),
            )
            for t in g.trajectories
        ],
    )


def _rule(reason: str) -> str:
    return reason.split(":", 1)[0]


class _Writes:
    """Rows collected over a batch of groups, written with one statement each."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime.now(UTC)  # the database's clock (curate): wait_until is compared with it
        self.trajectories: list[tuple[int, int, float, str, str]] = []
        self.segments: list[tuple[int, int, list[float]]] = []
        self.groups: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.outcomes: list[tuple[str, float]] = []
        self.counts: dict[str, int] = {}
        self.errors: list[dict[str, Any]] = []
        self.curated: list[tuple[int, datetime]] = []
        self.waiting: list[dict[str, Any]] = []
        self.history: remedies.SlotHistory = {}
        self.sent_back: set[int] = set()  # groups a rescore / recurate sent back after they were curated

    def untrainable(self, g: Group, reason: str, policy: specs.Versioned | None = None) -> None:
        """A group the trainer could not use never reaches the ready queue (dropped, with its decision naming
        the policy that would have curated it, when it resolves)."""
        now = self.now
        self.errors.append({"pk": g.pk, "status": "dropped", "drop_reason": "untrainable"})
        self.decisions.append({"group_pk": g.pk, "idx": None, "policy_name": policy and policy.name,
                               "policy_version": policy and policy.version,
                               "action": "drop", "rule": "untrainable", "reason": reason})
        self.curated.append((g.pk, now))
        self.counts["dropped"] = self.counts.get("dropped", 0) + 1

    def error(self, g: Group, reason: str, policy: specs.Versioned | None = None) -> None:
        """The group could not be curated: ``curation_error``, with a decision naming the cause."""
        # curated_at stays unset: the statistics rollup counts only groups that were curated
        self.errors.append({"pk": g.pk, "status": "curation_error", "drop_reason": "curation_error"})
        self.decisions.append({"group_pk": g.pk, "idx": None, "policy_name": policy and policy.name,
                               "policy_version": policy and policy.version, "action": "drop",
                               "rule": "curation_error", "reason": reason})
        self.counts["curation_error"] = self.counts.get("curation_error", 0) + 1

    def wait(self, g: Group, d: GroupDecision, policy: specs.Versioned, rules: CurationPolicy, dataset: str,
             slots: list[int], trained_oldest: int) -> None:
        """Remedy members that can still be remedied: one request per slot, the group waits for them."""
        now = self.now
        until = remedies.wait_until(rules, now)
        log = {"group_pk": g.pk, "policy_name": policy.name, "policy_version": policy.version}
        by_idx = {t.idx: t for t in g.trajectories}
        for t in d.trajectories:
            self.trajectories.append((g.pk, t.index, 0.0, t.action, t.reason))
            if t.index not in slots:
                continue
            max_tokens = remedies_budget(g, rules)
            budget = {**g.sampling, "max_tokens": max_tokens} if max_tokens else dict(g.sampling)
            self.requests.append(remedies.request_row(g, t.index, t.action, budget, dataset, trained_oldest))
            asked = remedies.slot_remedy(t.action, by_idx[t.index], g.policy_version, trained_oldest)
            why = remedies.remedy_note(t.action, by_idx[t.index], g.policy_version, trained_oldest)
            self.decisions.append({**log, "idx": t.index, "action": asked, "rule": remedies.REQUESTED,
                                   "reason": f"slot {t.index}: {by_idx[t.index].finish_reason} -> {asked}{why} "
                                             f"(max_tokens {budget.get('max_tokens')}); the group waits until "
                                             f"{until.isoformat()}"})
        self.counts["waiting"] = self.counts.get("waiting", 0) + 1
        self.waiting.append({"pk": g.pk, "status": "waiting", "wait_until": until,
                             "curation_policy_name": policy.name, "curation_policy_version": policy.version})

    def add(self, g: Group, d: GroupDecision, policy: specs.Versioned, dataset: str,
            rules: CurationPolicy | None = None, version: int | None = None) -> None:
        """A curated group's rows; ``version``: the one its staleness was measured from (``training_version``),
        stored as its ``oldest_version`` so a lease's staleness check agrees with curation's."""
        rules = rules or CurationPolicy()
        again = g.pk in self.sent_back  # a rescore / recurate: no new rollouts, the group trains with what it has
        remedy = [t for t in d.trajectories if t.action in REMEDY_ACTIONS]
        trained_oldest = g.policy_version if version is None else version
        if d.drop_reason != "stale" and not again:
            members = {t.idx: t for t in g.trajectories}
            slots = [t.index for t in remedy if remedies.can_remedy(
                self.history.get((g.pk, t.index), []),
                remedies.slot_remedy(t.action, members[t.index], g.policy_version, trained_oldest), rules)]
            if slots:
                self.wait(g, d, policy, rules, dataset, slots, trained_oldest)
                return
        log = {"group_pk": g.pk, "policy_name": policy.name, "policy_version": policy.version}
        self._members(g, d, rules, log, again)
        if d.status == "dropped":
            self.decisions.append({**log, "idx": None, "action": "drop", "rule": _rule(d.drop_reason or "dropped"),
                                   "reason": d.drop_reason or "dropped"})
            self.requests.append({"prompt_id": None, "dataset": dataset, "reason": "refill", "n": len(g.trajectories),
                                  "budget": dict(g.sampling), "priority": 1.0, "source_group_pk": g.pk})
        # no wait: a fresh group of the prompt instead of the resample / resume members (the pre-0010 behaviour),
        # asked for once: a rescore / recurate asks for nothing
        fresh = [t.index for t in remedy] if rules.resample_wait_seconds <= 0 and not again else []
        if fresh:
            larger = remedies_budget(g, rules)  # resume members too: a fresh group is their remedy here
            budget = {**g.sampling, "max_tokens": larger} if larger else dict(g.sampling)
            self.requests.append({"prompt_id": g.prompt_id, "dataset": dataset, "reason": "resample",
                                  "n": len(fresh), "budget": budget, "priority": 2.0, "source_group_pk": g.pk})
        if d.outcome_mean is not None and contributes_outcome(d.outcome_mean, d.drop_reason):
            self.outcomes.append((g.prompt_id, d.outcome_mean))
        self.counts[d.status] = self.counts.get(d.status, 0) + 1
        oldest = None if version is None or version >= g.policy_version else version
        self.groups.append({"pk": g.pk, "status": d.status, "drop_reason": d.drop_reason,
                            "curation_policy_name": policy.name, "curation_policy_version": policy.version,
                            "metric_std": d.metric_std, "outcome_mean": d.outcome_mean, "curated_at": self.now,
                            "ready_at": self.now if d.status == "ready" else None, "oldest_version": oldest})

    def _members(self, g: Group, d: GroupDecision, rules: CurationPolicy, log: dict[str, Any], again: bool) -> None:
        """Each member's action, advantage and decision rows. A slot's remedy steps happened once: a slot cut
        again past its bound is ``remedy_exhausted`` at the curation that first sees its replacement, and a
        group sent back by a rescore / recurate asks for no slot (``no_new_rollouts``)."""
        for t in d.trajectories:
            self.trajectories.append((g.pk, t.index, t.advantage, t.action, t.reason))
            if t.segment_advantages:
                self.segments.append((g.pk, t.index, list(t.segment_advantages)))
            if t.action != "keep":
                self.decisions.append({**log, "idx": t.index, "action": t.action, "rule": _rule(t.reason), "reason": t.reason})
            if t.action not in REMEDY_ACTIONS:
                continue
            if again:
                self.decisions.append({**log, "idx": t.index, "action": t.action, "rule": NO_NEW_ROLLOUTS,
                                       "reason": f"slot {t.index}: not asked for (a rescore / recurate takes no new "
                                                 "rollouts); it stays out of training and the group trains with "
                                                 "what it has"})
            elif remedies.was_remedied(self.history.get((g.pk, t.index), [])):
                self.decisions.append({**log, "idx": t.index, "action": t.action, "rule": remedies.EXHAUSTED,
                                       "reason": f"slot {t.index}: cut again after {t.action}; the bound of "
                                                 f"{remedies.limit_of(t.action, rules)} is reached, it stays out "
                                                 "of training"})

    def flush(self, session: Session) -> None:
        curate_repo.update_trajectory_decisions(session, self.trajectories)
        curate_repo.update_segment_advantages(session, self.segments)
        ingest.update_groups(session, self.groups)
        ingest.update_groups(session, self.errors)
        ingest.update_groups(session, self.waiting)
        ingest.update_groups(session, [{"pk": pk, "curated_at": at} for pk, at in self.curated])
        remedies.log_decisions(session, self.decisions)
        curate_repo.insert_sampling_requests(session, self.requests)
        curate_repo.record_outcomes(session, self.outcomes)


def _decide(session: Session, policy: CurationPolicy, members: list[Group], current: int | None,
            budgets: dict[tuple[int, int], int] | None = None, versions: dict[int, int] | None = None
            ) -> list[GroupDecision | str]:
    """Decisions for ``members`` in one call; when that raises, group by group, so one group that
    cannot be curated (a metric its spec lacks, bad data) gets its error and the others go on. ``versions``:
    group pk -> the version its staleness is measured from (``training_version``)."""
    versions = versions or {}

    def components(gs: list[Group]) -> dict:
        out: dict = {}
        if policy.zero_variance.metric not in _PLAIN_METRICS:
            for spec_key in {(g.reward_spec_name, g.reward_spec_version) for g in gs}:
                out.update(curate_repo.trajectory_components(session, [g.pk for g in gs], spec_key))
        return out

    try:
        comps = components(members)
        return list(curate_groups([_group_score(g, comps, budgets, versions.get(g.pk)) for g in members],
                                  policy, current))
    except Exception:  # noqa: BLE001 - isolate below
        pass
    out: list[GroupDecision | str] = []
    for g in members:
        try:
            out.append(curate_groups([_group_score(g, components([g]), budgets, versions.get(g.pk))], policy,
                                     current)[0])
        except Exception as exc:  # noqa: BLE001 - this group's error, recorded as its decision
            out.append(f"curation: {type(exc).__name__}: {exc}"[:2000])
    return out


def _sent_back(session: Session, pks: list[int]) -> set[int]:
    """Of ``pks``, the groups a rescore / recurate sent back after they were curated (their marker decision,
    ``SENT_BACK``): their remedies were settled then, and a second pass takes no new rollouts."""
    return curate_repo.with_decision(session, pks, SENT_BACK)


def contributes_outcome(outcome_mean: float | None, drop_reason: str | None) -> bool:
    """Whether a curated group's outcome mean went into its prompt's recent outcomes (``record_outcomes``): the
    one rule for adding it at curation and for taking it back out before a rescore / recurate."""
    return outcome_mean is not None and drop_reason not in NO_OUTCOME_DROPS


def untrainable_reason(g: Group) -> str | None:
    """Why the trainer could not use this group, or None: every trajectory needs its token ids and loss
    mask (behaviour log-probs are optional: a trainer that needs them recomputes or nacks)."""
    for t in g.trajectories:
        missing = [name for name in ("token_ids", "loss_mask") if not getattr(t, name)]
        if missing:
            return f"untrainable: trajectory {t.idx} has no {' / '.join(missing)}"
    return None


def _resolve(session: Session, groups: list[Group], prompts: dict, writes: _Writes
             ) -> dict[int, tuple[specs.Versioned, CurationPolicy, list[Group]]]:
    """Groups by curation policy; a group whose policy cannot be resolved is marked curation_error."""
    cache: dict = {}
    by_policy: dict[int, tuple[specs.Versioned, CurationPolicy, list[Group]]] = {}
    for g in groups:
        try:
            v, policy = _policy_for(session, g, prompts, cache)
        except Exception as exc:  # noqa: BLE001 - a missing / invalid policy is this group's problem
            writes.error(g, f"curation policy: {exc}"[:2000])
            continue
        by_policy.setdefault(id(policy), (v, policy, []))[2].append(g)
    return by_policy


def curate(session: Session, groups: list[Group]) -> dict[str, int]:
    """Curate ``groups`` (held by the caller, status 'scored'); returns counts by resulting status."""
    if not groups:
        return {}
    prompts = ingest.prompts_by_id(session, {g.prompt_id for g in groups})
    current = policy_service.current_version(session)
    writes = _Writes(db_now(session))  # the database's clock, not this worker's
    trainable, cache = [], {}
    for g in groups:
        reason = untrainable_reason(g)
        if reason is None:
            trainable.append(g)
            continue
        try:
            named: specs.Versioned | None = _policy_for(session, g, prompts, cache)[0]
        except Exception:  # noqa: BLE001 - the drop stands; only the policy's name is not known
            named = None
        writes.untrainable(g, reason, named)
    by_policy = _resolve(session, trainable, prompts, writes)
    writes.history = curate_repo.slot_history(session, [g.pk for g in trainable])
    writes.sent_back = _sent_back(session, [g.pk for _, policy, members in by_policy.values() for g in members
                                            if any(_action(t.finish_reason, policy) in REMEDY_ACTIONS
                                                   for t in g.trajectories)])  # only a remedy member asks
    budgets = member_budgets(writes.history)
    for named_policy, policy, members in by_policy.values():
        versions = {g.pk: training_version(g, policy) for g in members}
        for g, d in zip(members, _decide(session, policy, members, current, budgets, versions), strict=True):
            if isinstance(d, str):
                writes.error(g, d, named_policy)
            else:
                writes.add(g, d, named_policy, prompts[g.prompt_id].dataset, policy, versions[g.pk])
    writes.flush(session)
    waiting = {row["pk"] for row in writes.waiting}  # counted once they are curated for good
    stats.record_groups(session, [g.pk for g in groups if g.pk not in waiting])  # pre-aggregated reward statistics
    return writes.counts


def remedies_budget(g: Group, rules: CurationPolicy) -> int | None:
    """The larger max_tokens of a resample / resume request, in place or as a fresh group (the group's
    budget times the multiplier; None when the group's budget is unknown)."""
    from filters.rules import resample_budget

    max_tokens = g.sampling.get("max_tokens") if isinstance(g.sampling, dict) else None
    return resample_budget(max_tokens if isinstance(max_tokens, int) else None, rules.resample_budget_multiplier)


def expire_waits(session: Session) -> dict[str, int]:
    """Worker maintenance: waiting groups past their deadline train with what they have (their unfilled
    slots are recorded); returns counts by resulting status."""
    return curate(session, remedies.expire_waits(session))


def fill_slot(session: Session, group_id: str, index: int, policy_version: int, trajectory: Any, *,
              max_sequence_tokens: int, key: Any, request_id: int | None = None) -> tuple[dict[str, Any], bool]:
    """``POST /v1/groups/{group_id}/trajectories/{index}`` (see ``service.curation.remedies``)."""
    return remedies.fill_slot(session, group_id, index, policy_version, trajectory,
                              max_sequence_tokens=max_sequence_tokens, key=key, request_id=request_id)


def open_resume_request(session: Session, group_pk: int, index: int) -> Any:
    """The newest resume request of slot ``index`` of the group still open (not filled, not expired), or None."""
    waiting = [r for r in curate_repo.slot_requests(session, group_pk, index)
               if r.reason == "resume" and r.filled_at is None and r.status != "expired"]
    return waiting[-1] if waiting else None


def forget_outcomes(session: Session, rows: list[tuple[str, float | None, str | None]]) -> None:
    """Take curated groups' outcomes back out of their prompts' outcome history (rescore and recurate send
    them through again; nothing is counted twice). ``rows``: (prompt id, outcome_mean, drop_reason) of
    curated groups; only the outcomes curation added (``contributes_outcome``) are taken back."""
    curate_repo.retract_outcomes(session, [(pid, mean) for pid, mean, drop in rows
                                           if mean is not None and contributes_outcome(mean, drop)])


def record_decisions(session: Session, rows: list[dict[str, Any]]) -> None:
    """Decision-log rows (every drop / mask / penalty / error with its reason), for the other stages too."""
    remedies.log_decisions(session, rows)

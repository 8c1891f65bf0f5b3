"""Re-scoring under a new reward-spec version and re-curation under a new policy version, without new
rollouts. Earlier rewards stay stored under their spec version and earlier decisions stay in the log.

A curated group sent back leaves a decision row (rule ``rescore`` / ``recurate``); curation reads it
(``service.curation.service.SENT_BACK``): such a group asks for no remedy slot and no fresh group, it trains with the members it has.

One call takes at most ``MAX_GROUPS_PER_CALL`` groups and skips groups that are locked at that moment
(being curated or leased): call again until it answers ``groups: 0``."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from reward_models.spec import RewardSpec
from service.api.errors import Forbidden
from service.curation import service as curation
from service.scoring import repository as repo
from service.specs import service as specs
from service.stats import service as stats

# leased and consumed groups belong to a trainer: they are never pulled back
RESCORABLE = ("received", "scored", "ready", "dropped", "reward_error")
RECURATABLE = ("scored", "ready", "dropped")
def _requeue(session: Session, values: dict[str, Any], clear_scores: bool, marker: dict[str, Any],
             **filters: Any) -> list[int]:
    """Lock the matching groups, take them out of the statistics, mark the curated ones (``marker``: their
    decision row), then send them back."""
    pks = repo.lock_matching(session, **filters)
    stats.retract_groups(session, pks)
    curated = repo.curated_groups(session, pks)
    curation.forget_outcomes(session, [(pid, mean, drop) for _, pid, mean, drop in curated])  # no double counting
    curation.record_decisions(session, [{"group_pk": pk, "idx": None, **marker} for pk, *_ in curated])
    # clearing the claim fences off a worker still scoring the old request: its write is refused
    repo.requeue(session, pks, {**values, "claimed_by": None, "claimed_until": None, "outcome_mean": None},
                 clear_scores)
    return pks


def rescore(session: Session, reward_spec: str, caller_specs: frozenset[str] = frozenset(),
            **filters: Any) -> dict[str, Any]:
    """Send the matching groups to ``reward_spec``. A spec that runs references as code is refused (403
    naming the rule, nothing requeued) when a matching group's prompt carries a reference no admin key
    loaded (``service.specs.references``), unless the spec is one of ``caller_specs``."""
    v = specs.resolve_reward_spec(session, reward_spec)
    if specs.runs_reference(RewardSpec.model_validate(v.body)) and v.name not in caller_specs:
        n, prompt_ids = repo.non_admin_code_references(
            session, specs.CODE_REFERENCE_FIELDS, statuses=RESCORABLE, **filters)
        if n:
            raise Forbidden(
                f"reward_spec: {v.name!r} runs its reference as code (verifier.code) and {n} matching group(s) "
                f"have a reference that no admin key loaded (prompts {', '.join(map(repr, prompt_ids))}"
                f"{', ...' if n > len(prompt_ids) else ''}); only a reference an admin key loaded runs as code: "
                "review them and re-load them with POST /v1/prompts, narrow the filter, or list the spec in "
                "GRPO_CURATOR_CALLER_REFERENCE_SPECS",
                detail={"field": "reward_spec", "groups": n, "prompt_ids": prompt_ids})
    values = {"status": "received", "reward_spec_name": v.name, "reward_spec_version": v.version,
              "score_attempts": 0, "score_deaths": 0, "death_tokens": [], "score_error": None, "retry_at": None, "drop_reason": None,
              "curated_at": None, "ready_at": None}
    marker = {"policy_name": None, "policy_version": None, "action": "rescore", "rule": "rescore",
              "reason": f"rescored with {v.name}@{v.version}: the same rollouts scored and curated again (no remedy "
                        "slot or fresh group is asked for)"}
    pks = _requeue(session, values, True, marker, statuses=RESCORABLE, **filters)
    return {"groups": len(pks), "reward_spec": f"{v.name}@{v.version}"}


def recurate(session: Session, curation_policy: str, **filters: Any) -> dict[str, Any]:
    v = specs.resolve_curation_policy(session, curation_policy)
    values = {"status": "scored", "curation_policy_name": v.name, "curation_policy_version": v.version,
              "drop_reason": None, "curated_at": None, "ready_at": None}
    marker = {"policy_name": v.name, "policy_version": v.version, "action": "recurate", "rule": "recurate",
              "reason": f"recurated under {v.name}@{v.version}: the same rollouts curated again (no remedy slot or "
                        "fresh group is asked for)"}
    pks = _requeue(session, values, False, marker, statuses=RECURATABLE, **filters)
    return {"groups": len(pks), "curation_policy": f"{v.name}@{v.version}"}

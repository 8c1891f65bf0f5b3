"""Versioned reward specs and curation policies, and what attaches them to datasets and prompts.

A name refers to its latest version; ``name@N`` to version N. Posting a body equal to the latest version's
returns that version (no new version); versions never change once written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.orm import Session

from filters.policy import CurationPolicySpec
from filters.types import CurationPolicy
from reward_models.spec import RewardSpec
from service.api.errors import BadRequest, NotFound
from service.api.schemas import INT4_MAX
from service.specs import repository as spec_repo
from service.specs.references import (  # noqa: F401 - the rule, for other domains
    CODE_REFERENCE_FIELDS,
    check_caller_references,
    runs_reference,
    stored_reference_problem,
)
from service.store.models import CurationPolicyRow, RewardSpecRow

DEFAULT_SPEC = RewardSpec(name="default", components=[{"name": "correct", "kind": "verifier.math", "outcome": True}])
DEFAULT_POLICY = CurationPolicySpec(name="default")


@dataclass(frozen=True)
class Versioned:
    name: str
    version: int
    body: dict[str, Any]
    created: bool = False  # true when this call stored the version


def parse_ref(ref: str, field: str) -> tuple[str, int | None]:
    """'name' -> (name, None); 'name@3' -> (name, 3)."""
    name, sep, version = ref.rpartition("@") if "@" in ref else (ref, "", "")
    if not name or (sep and not (version.isascii() and version.isdigit() and len(version) <= 10 and 1 <= int(version) <= INT4_MAX)):
        raise BadRequest(
            f"{field}: expected 'name' or 'name@version' with a version from 1 to {INT4_MAX}, got {ref!r}"
        )
    return name, int(version) if sep else None


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _create(session: Session, model: type[RewardSpecRow] | type[CurationPolicyRow], name: str, body: dict) -> Versioned:
    digest = _digest(body)
    current = spec_repo.latest(session, model, name)
    if current is not None and current.body_hash == digest:
        return Versioned(name, current.version, current.body)
    return Versioned(name, spec_repo.add_version(session, model, name, body, digest), body, created=True)


def create_reward_spec(session: Session, spec: RewardSpec, judge_endpoints: Collection[str] | None = None) -> Versioned:
    """Store a new version (or return the identical latest). With ``judge_endpoints`` (the deployment's
    endpoint names), a ``judge.llm`` component naming another endpoint is a 422."""
    for i, c in enumerate(spec.components):
        name = c.params.get("endpoint")
        if judge_endpoints is not None and c.kind == "judge.llm" and name not in judge_endpoints:
            known = ", ".join(sorted(judge_endpoints)) or "none configured (GRPO_CURATOR_JUDGE_ENDPOINTS)"
            raise BadRequest(f"components[{i}].params.endpoint: unknown judge endpoint {name!r}; configured: {known}")
    return _create(session, RewardSpecRow, spec.name, spec.model_dump(mode="json"))


def create_curation_policy(session: Session, policy: CurationPolicySpec) -> Versioned:
    return _create(session, CurationPolicyRow, policy.name, policy.model_dump(mode="json"))


def _resolve(session: Session, model: Any, ref: str, field: str) -> Versioned:
    name, version = parse_ref(ref, field)
    row = spec_repo.latest(session, model, name) if version is None else spec_repo.get_version(session, model, name, version)
    if row is None:
        what = "reward spec" if model is RewardSpecRow else "curation policy"
        raise NotFound(f"{field}: no {what} {ref!r}", status_code=422)
    return Versioned(row.name, row.version, row.body)


def resolve_reward_spec(session: Session, ref: str, field: str = "reward_spec") -> Versioned:
    return _resolve(session, RewardSpecRow, ref, field)


def resolve_curation_policy(session: Session, ref: str, field: str = "curation_policy") -> Versioned:
    return _resolve(session, CurationPolicyRow, ref, field)


def get_versioned(session: Session, kind: str, name: str, version: int | None) -> Versioned:
    model = RewardSpecRow if kind == "reward_spec" else CurationPolicyRow
    ref = name if version is None else f"{name}@{version}"
    try:
        return _resolve(session, model, ref, "name")
    except NotFound as exc:
        raise NotFound(exc.message) from None


def set_dataset(session: Session, name: str, reward_spec: str | None, curation_policy: str | None) -> dict[str, Any]:
    """Attach a spec and a policy to a dataset (each checked to exist)."""
    if reward_spec is not None:
        resolve_reward_spec(session, reward_spec)
    if curation_policy is not None:
        resolve_curation_policy(session, curation_policy)
    spec_repo.upsert_dataset(session, name, reward_spec, curation_policy)
    return {"name": name, "reward_spec": reward_spec, "curation_policy": curation_policy}


def get_dataset(session: Session, name: str) -> dict[str, Any]:
    row = spec_repo.get_dataset(session, name)
    if row is None:
        raise NotFound(f"name: no dataset {name!r} has been configured")
    return {"name": row.name, "reward_spec": row.reward_spec, "curation_policy": row.curation_policy}


def effective_reward_spec(session: Session, prompt_ref: str | None, dataset: str) -> tuple[Versioned, RewardSpec]:
    """The spec a group is scored with: the prompt's, else its dataset's, else the built-in default."""
    ref = prompt_ref or _dataset_field(session, dataset, "reward_spec")
    v = resolve_reward_spec(session, ref) if ref else ensure_default_spec(session)
    return v, RewardSpec.model_validate(v.body)


def effective_policy(session: Session, prompt_ref: str | None, dataset: str) -> tuple[Versioned, CurationPolicy]:
    ref = prompt_ref or _dataset_field(session, dataset, "curation_policy")
    v = resolve_curation_policy(session, ref) if ref else ensure_default_policy(session)
    return v, CurationPolicySpec.model_validate(v.body).to_policy()


def scoring_spec(session: Session, prompt_ref: str | None, dataset: str) -> tuple[str, RewardSpec | None]:
    """(name, spec) a prompt would be scored with, read-only; ('', None) when the reference cannot be
    resolved (ingest reports unknown names itself)."""
    ref = prompt_ref or _dataset_field(session, dataset, "reward_spec")
    try:
        if ref:
            v = resolve_reward_spec(session, ref)
            name, body = v.name, v.body
        else:
            row = spec_repo.latest(session, RewardSpecRow, "default")
            name, body = "default", row.body if row is not None else DEFAULT_SPEC.model_dump(mode="json")
    except (NotFound, BadRequest):
        return "", None
    return name, RewardSpec.model_validate(body)


def _dataset_field(session: Session, dataset: str, field: str) -> str | None:
    row = spec_repo.get_dataset(session, dataset)
    return None if row is None else getattr(row, field)


def ensure_default_spec(session: Session) -> Versioned:
    current = spec_repo.latest(session, RewardSpecRow, "default")
    return Versioned(current.name, current.version, current.body) if current else create_reward_spec(session, DEFAULT_SPEC)


def ensure_default_policy(session: Session) -> Versioned:
    current = spec_repo.latest(session, CurationPolicyRow, "default")
    if current is not None:
        return Versioned(current.name, current.version, current.body)
    return create_curation_policy(session, DEFAULT_POLICY)


def default_policy_body(session: Session) -> dict[str, Any]:
    """The latest stored ``default`` curation policy's body, else the built-in default's."""
    row = spec_repo.latest(session, CurationPolicyRow, "default")
    return row.body if row is not None else DEFAULT_POLICY.model_dump(mode="json")

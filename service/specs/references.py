"""Who may supply a reference that a reward spec runs as code (docs/security.md, "References run as code").

``verifier.code`` executes parts of the prompt's reference: ``tests`` and ``prompt`` are Python source run by
the harness, ``io`` drives the program. For a spec with such a component these fields come only from a
prompt loaded by an admin key (``POST /v1/prompts``, or an admin's inline prompt / score request), unless the
deployment lists the spec's name in ``GRPO_CURATOR_CALLER_REFERENCE_SPECS`` (specs are created by admin keys
only, so the opt-in is an admin's and an operator's decision). Any other caller's reference carrying them is
a 403 naming the field, before anything is stored or scored.

The rule is enforced again wherever a code spec is about to run a stored reference, since a reference
stored under a spec without ``verifier.code`` may later be scored by one (a rescore, a dataset or spec name
switched to code): each prompt records whether an admin key wrote its reference (``prompts.
reference_from_admin``), and ``stored_reference_problem`` names the rule for one that was not — the worker's
scoring stage makes it the group's ``reward_error`` (the operator's configuration, never a 0) and
``POST /v1/rescore`` refuses to send such groups to a code spec.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from reward_models.spec import RewardSpec
from service.api.errors import Forbidden
from service.auth.service import Principal

# component kinds that execute their reference, and the reference fields they execute
CODE_KINDS = frozenset({"verifier.code"})
CODE_REFERENCE_FIELDS = ("tests", "prompt", "io")
OPT_IN_SETTING = "GRPO_CURATOR_CALLER_REFERENCE_SPECS"


def runs_reference(spec: RewardSpec) -> bool:
    """Does a component of ``spec`` execute (part of) the reference?"""
    return any(c.kind in CODE_KINDS for c in spec.components)


def caller_may_supply(spec_name: str, spec: RewardSpec | None, key: Principal, caller_specs: Collection[str]) -> bool:
    return key.is_admin or spec is None or not runs_reference(spec) or spec_name in caller_specs


def check_caller_references(
    spec_name: str,
    spec: RewardSpec | None,
    key: Principal,
    references: Iterable[tuple[str, Mapping[str, Any] | Any]],
    caller_specs: Collection[str],
) -> None:
    """403 naming the first ``(field, reference)`` that carries a field the spec would execute, when ``key``
    may not supply one for this spec."""
    if caller_may_supply(spec_name, spec, key, caller_specs):
        return
    for field, reference in references:
        if not isinstance(reference, Mapping):
            continue
        for name in CODE_REFERENCE_FIELDS:
            if name in reference:
                raise Forbidden(
                    f"{field}.{name}: reward spec {spec_name!r} runs its reference as code (verifier.code); "
                    f"only a prompt loaded by an admin key may supply it (POST /v1/prompts, then refer to the "
                    f"prompt by id), unless the deployment lists the spec in {OPT_IN_SETTING}",
                    detail={"field": f"{field}.{name}", "reward_spec": spec_name},
                )


RULE = "only a reference an admin key loaded runs as code"


def code_fields(reference: Mapping[str, Any] | Any) -> list[str]:
    """The fields of ``reference`` a code spec would execute."""
    return [name for name in CODE_REFERENCE_FIELDS if isinstance(reference, Mapping) and name in reference]


def stored_reference_problem(spec_name: str, spec: RewardSpec, prompt_id: str, reference: Any,
                             from_admin: bool, caller_specs: Collection[str]) -> str | None:
    """Why ``spec`` may not run prompt ``prompt_id``'s stored reference (None: it may)."""
    if from_admin or not runs_reference(spec) or spec_name in caller_specs:
        return None
    fields = code_fields(reference)
    if not fields:
        return None
    return (f"reference source: reward spec {spec_name!r} runs its reference as code (verifier.code) and "
            f"prompt {prompt_id!r}'s reference.{fields[0]} was not loaded by an admin key; {RULE} "
            f"(review it and re-load it with POST /v1/prompts, or list the spec in {OPT_IN_SETTING})")

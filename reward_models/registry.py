"""Reward components registered by kind (the fixed names of DESIGN.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_models.agent_rules import RepetitionRule, ToolCallRule
from reward_models.base import RewardComponent
from reward_models.code_verifier import CodeVerifier
from reward_models.external import ExternalReported, PythonFunction
from reward_models.llm_judge import JudgeEndpoint, LLMJudge
from reward_models.reward_model import RewardModelJudge
from reward_models.rules import FormatRule, LengthRule, OverlongRule, TurnsRule
from reward_models.verifiers import ExactMatchVerifier, F1Verifier, JsonSchemaVerifier, MathVerifier

KINDS: dict[str, type[RewardComponent]] = {
    cls.kind: cls
    for cls in (
        FormatRule,
        ToolCallRule,
        RepetitionRule,
        LengthRule,
        OverlongRule,
        TurnsRule,
        MathVerifier,
        ExactMatchVerifier,
        F1Verifier,
        CodeVerifier,
        JsonSchemaVerifier,
        LLMJudge,
        RewardModelJudge,
        ExternalReported,
        PythonFunction,
    )
}


def make_component(
    kind: str, params: dict[str, Any], *, judge_endpoints: Mapping[str, JudgeEndpoint] | None = None
) -> RewardComponent:
    """Build the component of ``kind`` with ``params``; ValueError for an unknown kind or bad params.
    ``judge_endpoints``: the deployment's judge endpoints by name (``judge.llm`` resolves its own)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(sorted(KINDS))}")
    if KINDS[kind] is LLMJudge:
        return LLMJudge(params, endpoints=judge_endpoints)
    return KINDS[kind](params)

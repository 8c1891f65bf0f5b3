"""Reward components registered by kind (the fixed names of DESIGN.md)."""

from __future__ import annotations

from typing import Any

from reward_models.agent_rules import RepetitionRule, ToolCallRule
from reward_models.base import RewardComponent
from reward_models.code_verifier import CodeVerifier
from reward_models.external import ExternalReported, PythonFunction
from reward_models.llm_judge import LLMJudge
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


def make_component(kind: str, params: dict[str, Any]) -> RewardComponent:
    """Build the component of ``kind`` with ``params``; ValueError for an unknown kind or bad params."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(sorted(KINDS))}")
    return KINDS[kind](params)

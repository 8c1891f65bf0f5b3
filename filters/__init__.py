"""Curation of scored rollout groups: zero-variance filtering, finish_reason policy, staleness,
minimum group size and group-relative advantages. Pure functions over plain data (numpy only):
no database, no HTTP, no torch.
"""

from filters.advantages import (
    BATCHED_ESTIMATORS,
    ESTIMATORS,
    batched_advantages,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
)
from filters.curate import curate_group, curate_groups
from filters.curriculum import pass_rate, priority_for, prompt_priority
from filters.overlong import overlong_buffer_tokens, soft_overlong_penalties, soft_overlong_penalty
from filters.policy import CurationPolicySpec
from filters.types import (
    ACTIONS,
    DEFAULT_FINISH_REASON_ACTIONS,
    DROP_REASONS,
    FINISH_REASONS,
    Action,
    AdvantageConfig,
    CurationPolicy,
    CurriculumConfig,
    FinishReason,
    GroupDecision,
    GroupScore,
    TrajectoryDecision,
    TrajectoryScore,
    ZeroVariance,
)

__all__ = [
    "ACTIONS",
    "BATCHED_ESTIMATORS",
    "DEFAULT_FINISH_REASON_ACTIONS",
    "DROP_REASONS",
    "ESTIMATORS",
    "FINISH_REASONS",
    "Action",
    "AdvantageConfig",
    "CurationPolicy",
    "CurationPolicySpec",
    "CurriculumConfig",
    "FinishReason",
    "GroupDecision",
    "GroupScore",
    "TrajectoryDecision",
    "TrajectoryScore",
    "ZeroVariance",
    "batched_advantages",
    "compute_advantages",
    "curate_group",
    "curate_groups",
    "dr_grpo_advantages",
    "grpo_advantages",
    "overlong_buffer_tokens",
    "pass_rate",
    "priority_for",
    "prompt_priority",
    "rloo_advantages",
    "soft_overlong_penalties",
    "soft_overlong_penalty",
]

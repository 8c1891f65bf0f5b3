"""Reward components (rule / verifier / judge), their registry, reward specs and the scorer.

Pure package: imports neither the service, FastAPI nor SQLAlchemy; torch and transformers are
imported only when a reward model is first used.
"""

from reward_models.base import ComponentResult, PromptInfo, RewardComponent, Sample
from reward_models.pool import KillablePool, PoolTaskError
from reward_models.registry import KINDS, make_component
from reward_models.scoring import Scorer
from reward_models.spec import ComponentSpec, RewardSpec, ScoredSample, combine

__all__ = [
    "KINDS",
    "ComponentResult",
    "ComponentSpec",
    "KillablePool",
    "PoolTaskError",
    "PromptInfo",
    "RewardComponent",
    "RewardSpec",
    "Sample",
    "ScoredSample",
    "Scorer",
    "combine",
    "make_component",
]

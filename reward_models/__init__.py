"""Reward components (rule / verifier / judge), their registry, reward specs and the scorer.

Pure package: imports neither the service, FastAPI nor SQLAlchemy; torch and transformers are
imported only when a reward model is first used. Its names are loaded on first use (PEP 562), so
importing one submodule (``reward_models.llm_judge`` for the settings' ``JudgeEndpoint``) does not
load every component and its dependencies (jsonschema, numpy through filters).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reward_models.base import ComponentResult, PromptInfo, RewardComponent, Sample
    from reward_models.pool import KillablePool, PoolTaskError
    from reward_models.registry import KINDS, make_component
    from reward_models.scoring import Scorer
    from reward_models.spec import ComponentSpec, RewardSpec, ScoredSample, combine

# public name -> the submodule that defines it
_LAZY = {
    "ComponentResult": "reward_models.base",
    "PromptInfo": "reward_models.base",
    "RewardComponent": "reward_models.base",
    "Sample": "reward_models.base",
    "KillablePool": "reward_models.pool",
    "PoolTaskError": "reward_models.pool",
    "KINDS": "reward_models.registry",
    "make_component": "reward_models.registry",
    "Scorer": "reward_models.scoring",
    "ComponentSpec": "reward_models.spec",
    "RewardSpec": "reward_models.spec",
    "ScoredSample": "reward_models.spec",
    "combine": "reward_models.spec",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

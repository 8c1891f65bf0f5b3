"""Builders of leased batches (the JSON the service hands the trainer) and tiny models for trainer tests."""

from __future__ import annotations

import math
import random
from typing import Any

from torch import nn

from trainer.worker import TrainerConfig, build_model, tiny_model_config

VOCAB = 97


def make_trajectory(
    rng: random.Random, index: int, prompt_len: int, response_len: int, tool_len: int = 0
) -> dict[str, Any]:
    """prompt (mask 0) + response (mask 1), optionally split by a tool observation (mask 0) of tool_len.
    Sampler log-probs are near the tiny random model's (about -log VOCAB), so some ratios clip and most do not."""
    first = response_len // 2 if tool_len else response_len
    mask = [0] * prompt_len + [1] * first + [0] * tool_len + [1] * (response_len - first)
    n = len(mask)
    return {
        "index": index,
        "token_ids": [rng.randrange(1, VOCAB) for _ in range(n)],
        "loss_mask": mask,
        "logprobs": [round(-math.log(VOCAB) + rng.uniform(-0.4, 0.4), 4) if m else 0.0 for m in mask],
        "advantage": round(rng.uniform(-1.5, 1.5), 4),
        "total_reward": round(rng.random(), 4),
    }


def make_batch(
    n_groups: int = 3, group_size: int = 4, seed: int = 0, policy_version: int = 0
) -> dict[str, Any]:
    """A leased batch with varied prompt / response lengths and some tool observations."""
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        prompt_len = rng.randrange(2, 9)
        trajs = [
            make_trajectory(rng, i, prompt_len, rng.randrange(1, 14), tool_len=rng.choice([0, 0, 3]))
            for i in range(group_size)
        ]
        groups.append(
            {
                "id": f"g{seed}-{g}",
                "prompt_id": f"p{g}",
                "policy_version": policy_version,
                "trajectories": trajs,
            }
        )
    return {"batch_id": f"b{seed}", "expires_at": "2030-01-01T00:00:00Z", "groups": groups}


def tiny_config(**overrides: Any) -> TrainerConfig:
    """A TrainerConfig of a tiny random Qwen2 (vocab VOCAB) on CPU."""
    base: dict[str, Any] = {
        "model_config": tiny_model_config(vocab_size=VOCAB, hidden_size=32),
        "device": "cpu",
        "attn_implementation": "sdpa",
    }
    base.update(overrides)
    return TrainerConfig(**base)


def tiny_model(seed: int = 0) -> nn.Module:
    """A tiny random Qwen2 causal LM, the same weights for the same seed."""
    return build_model(tiny_config(seed=seed))

"""OpenRLHF: a ``reward_func`` file for ``--remote_rm_url integrations/openrlhf.py``.

OpenRLHF can also call the service directly: ``--remote_rm_url http://curator:8000/compat/openrlhf/<spec>/get_reward``
(or ``.../compat/openrlhf/key/<api key>/<spec>/get_reward`` when keys are on). This file does the same from
inside the trainer, reading the URL, spec and key from ``GRPO_CURATOR_URL``, ``GRPO_CURATOR_REWARD_SPEC`` and
``GRPO_CURATOR_API_KEY``; torch is imported only when the function runs (OpenRLHF has it).
"""

from __future__ import annotations

from typing import Any

from integrations._http import Client, jsonable, target


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """``{"rewards": tensor, "scores": tensor, "extra_logs": {name: tensor}}`` from the service's OpenRLHF
    route (what it answers for an unscorable item is the service's ``openrlhf_on_error`` setting)."""
    import torch

    t = target(kwargs.get("url"), kwargs.get("spec"), kwargs.get("api_key"))
    client = Client(t)
    try:
        body = {"query": list(queries), "prompts": list(prompts), "labels": jsonable(list(labels))}
        out = client.post(f"/compat/openrlhf/{t.spec}/get_reward", body)
    finally:
        client.close()
    return {"rewards": torch.tensor(out["rewards"]), "scores": torch.tensor(out["scores"]),
            "extra_logs": {k: torch.tensor(v) for k, v in out["extra_logs"].items()}}

"""OpenRLHF: a ``reward_func`` file for ``--remote_rm_url integrations/openrlhf.py``.

OpenRLHF can also call the service directly: ``--remote_rm_url http://curator:8000/compat/openrlhf/<spec>/get_reward``
(or ``.../compat/openrlhf/key/<api key>/<spec>/get_reward`` when keys are on). This file does the same from
inside the trainer, reading the URL, spec and key from ``GRPO_CURATOR_URL``, ``GRPO_CURATOR_REWARD_SPEC`` and
``GRPO_CURATOR_API_KEY``; torch is imported only when the function runs (OpenRLHF has it).
"""

from __future__ import annotations

import math
from typing import Any

from integrations._http import Client, jsonable, target


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """``{"rewards": tensor, "scores": tensor, "extra_logs": {name: tensor}}`` from the service's OpenRLHF
    route (what it answers for an unscorable item is the service's ``openrlhf_on_error`` setting)."""
    import torch

    t = target(kwargs.get("url"), kwargs.get("spec"), kwargs.get("api_key"))
    client = Client(t)
    try:
        rows = list(zip(queries, prompts, jsonable(list(labels)), strict=True))
        answers = client.post_chunked(f"/compat/openrlhf/{t.spec}/get_reward", rows, _body)
    finally:
        client.close()
    logs: dict[str, list[float]] = {}
    done = 0
    for a in answers:  # a chunk whose queries were all unscorable logs only reward_error: NaN elsewhere
        n = len(a["rewards"])
        for k in set(logs) | set(a["extra_logs"]):
            logs.setdefault(k, [math.nan] * done).extend(a["extra_logs"].get(k, [math.nan] * n))
        done += n
    return {"rewards": torch.tensor([x for a in answers for x in a["rewards"]]),
            "scores": torch.tensor([x for a in answers for x in a["scores"]]),
            "extra_logs": {k: torch.tensor(v) for k, v in logs.items()}}


def _body(rows: list[tuple[str, str, Any]]) -> dict[str, Any]:
    return {"query": [q for q, _, _ in rows], "prompts": [p for _, p, _ in rows], "labels": [lab for *_, lab in rows]}

"""OpenRLHF: a ``reward_func`` file for ``--remote_rm_url $(python -m grpo_curator_integrations.openrlhf)``.

OpenRLHF can also call the service directly: ``--remote_rm_url http://curator:8000/compat/openrlhf/<spec>/get_reward``
(or ``.../compat/openrlhf/key/<api key>/<spec>/get_reward`` when keys are on). This file does the same from
inside the trainer, reading the URL, spec and key from ``GRPO_CURATOR_URL``, ``GRPO_CURATOR_REWARD_SPEC`` and
``GRPO_CURATOR_API_KEY``; torch is imported only when the function runs (OpenRLHF has it).
"""

from __future__ import annotations

import math
from typing import Any

from grpo_curator_integrations._http import Client, ScoringError, jsonable, target


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """``{"rewards": tensor, "scores": tensor, "extra_logs": {name: tensor}}`` (tensors: OpenRLHF 0.8
    ``torch.cat``s them) from the service's OpenRLHF route. An unscorable item raises ScoringError naming it
    and why, inside OpenRLHF's reward task, so the run stops with the reason: the service answers 503
    (``openrlhf_on_error=fail``), or lists it in ``substituted`` (``value``, sent with ``extra_logs`` omitted
    too), which this function raises on unless called with ``on_error="value"`` (then the service's substitute
    stands, flagged as ``extra_logs["reward_error"]``)."""
    import torch

    t = target(kwargs.get("url"), kwargs.get("spec"), kwargs.get("api_key"))
    client = Client(t)
    try:
        rows = list(zip(queries, prompts, jsonable(list(labels)), strict=True))
        answers = client.post_chunked(f"/compat/openrlhf/{t.spec}/get_reward", rows, _body)
    finally:
        client.close()
    failed = _substituted(answers)
    if failed and kwargs.get("on_error", "raise") != "value":
        total = sum(len(a["rewards"]) for a in answers)
        raise ScoringError(f"query[{failed[0]}]: could not be scored ({len(failed)} of {total} items; the "
                           "service substituted a value: openrlhf_on_error=value)", detail={"failed": failed})
    logs: dict[str, list[float]] = {}
    done = 0
    for a in answers:  # a chunk whose queries were all unscorable logs only reward_error: NaN elsewhere
        n = len(a["rewards"])
        extra = dict(a.get("extra_logs") or {})  # none when the service omits them (openrlhf_extra_logs=omit)
        if "substituted" in a:
            flagged = set(a["substituted"])
            extra["reward_error"] = [float(i in flagged) for i in range(n)]
        for k in set(logs) | set(extra):
            logs.setdefault(k, [math.nan] * done).extend(extra.get(k, [math.nan] * n))
        done += n
    return {"rewards": torch.tensor([x for a in answers for x in a["rewards"]]),
            "scores": torch.tensor([x for a in answers for x in a["scores"]]),
            "extra_logs": {k: torch.tensor(v) for k, v in logs.items()}}


def _substituted(answers: list[dict[str, Any]]) -> list[int]:
    """The queries (indices into the whole call) whose reward the service substituted: its ``substituted``
    list, sent in every mode (``extra_logs`` is absent with ``openrlhf_extra_logs=omit``); an older service
    sends only ``extra_logs.reward_error``."""
    out: list[int] = []
    done = 0
    for a in answers:
        if "substituted" in a:
            out += [done + int(i) for i in a["substituted"]]
        else:
            out += [done + i for i, x in enumerate((a.get("extra_logs") or {}).get("reward_error", [])) if x]
        done += len(a["rewards"])
    return out


def _body(rows: list[tuple[str, str, Any]]) -> dict[str, Any]:
    return {"query": [q for q, _, _ in rows], "prompts": [p for _, p, _ in rows], "labels": [lab for *_, lab in rows]}


if __name__ == "__main__":  # the file's path, for --remote_rm_url (OpenRLHF loads reward functions by path)
    print(__file__)

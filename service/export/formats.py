"""Export records, one function per format, over the trajectory rows of one group (plain dicts).

Only trajectories that ended with ``finish_reason == "stop"`` and have a total become SFT / DPO / KTO data:
a trajectory cut off by a budget or by infrastructure is neither a positive nor a negative (DESIGN.md).
- ``sft``: the best correct trajectory of the group (outcome >= ``correct_threshold``, highest total, lowest
  index on ties), as conversational ``messages`` (prompt + trajectory) and ``tools`` (the prompt's
  ``metadata.tools``) when present; the same prompt + completion is written once.
- ``dpo``: ``prompt`` / ``chosen`` / ``rejected`` from mixed groups only: ``chosen`` is the best correct
  trajectory, ``rejected`` the worst incorrect one (by total); a group without both, or whose chosen total
  is not above the rejected one, is skipped.
- ``kto``: ``prompt`` / ``completion`` / ``label`` (outcome >= ``correct_threshold``) per trajectory.
- ``rollouts``: every stored trajectory with everything known about it (no filtering by finish reason).
``min_reward`` applies to the exported trajectory (the SFT pick, the DPO ``chosen``, each KTO / rollout row).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

Row = dict[str, Any]


@dataclass
class Options:
    format: str
    min_reward: float | None = None
    correct_threshold: float = 1.0
    _seen: set[bytes] = field(default_factory=set)  # SFT dedup: 16 bytes per written row


def message(m: dict[str, Any]) -> dict[str, Any]:
    """A stored message in the export's fixed shape (content as text; tool-call arguments as JSON text)."""
    content = m.get("content")
    calls = [
        {"id": c.get("id"), "type": c.get("type", "function"),
         "function": {"name": c["function"]["name"], "arguments": _text(c["function"].get("arguments", ""))}}
        for c in m.get("tool_calls") or []
    ]
    return {"role": m["role"], "content": content if isinstance(content, str) or content is None else _text(content),
            "tool_calls": calls or None, "tool_call_id": m.get("tool_call_id"), "name": m.get("name")}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def messages(ms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [message(m) for m in ms]


def _usable(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r["finish_reason"] == "stop" and r["total_reward"] is not None]


def _passes(row: Row, opts: Options) -> bool:
    return opts.min_reward is None or (row["total_reward"] is not None and row["total_reward"] >= opts.min_reward)


def _best(rows: list[Row]) -> Row:
    return max(rows, key=lambda r: (r["total_reward"], -r["idx"]))


def _split(rows: list[Row], opts: Options) -> tuple[list[Row], list[Row]]:
    """Usable rows that are correct (outcome >= correct_threshold) and incorrect; no outcome is neither."""
    usable = [r for r in _usable(rows) if r["outcome"] is not None]
    return ([r for r in usable if r["outcome"] >= opts.correct_threshold],
            [r for r in usable if r["outcome"] < opts.correct_threshold])


def sft(rows: list[Row], opts: Options) -> Iterator[Row]:
    correct, _ = _split(rows, opts)
    if not correct:
        return
    best = _best(correct)
    if not _passes(best, opts):
        return
    convo = messages(best["prompt_messages"]) + messages(best["messages"])
    key = hashlib.blake2b(orjson.dumps(convo), digest_size=16).digest()
    if key in opts._seen:
        return
    opts._seen.add(key)
    tools = (best["prompt_metadata"] or {}).get("tools")
    yield {"messages": convo, "tools": tools} if tools else {"messages": convo}


def dpo(rows: list[Row], opts: Options) -> Iterator[Row]:
    correct, incorrect = _split(rows, opts)
    if not correct or not incorrect:  # only a mixed group says which answer is right
        return
    chosen = _best(correct)
    rejected = min(incorrect, key=lambda r: (r["total_reward"], r["idx"]))
    if chosen["total_reward"] <= rejected["total_reward"] or not _passes(chosen, opts):
        return
    yield {"prompt": messages(chosen["prompt_messages"]), "chosen": messages(chosen["messages"]),
           "rejected": messages(rejected["messages"])}


def kto(rows: list[Row], opts: Options) -> Iterator[Row]:
    for r in _usable(rows):
        if r["outcome"] is not None and _passes(r, opts):
            yield {"prompt": messages(r["prompt_messages"]), "completion": messages(r["messages"]),
                   "label": r["outcome"] >= opts.correct_threshold}


def rollouts(rows: list[Row], opts: Options) -> Iterator[Row]:
    for r in rows:
        if not _passes(r, opts):
            continue
        spec = f"{r['reward_spec_name']}@{r['reward_spec_version']}" if r["reward_spec_name"] else None
        yield {
            "uid": f"{r['group_id']}/{r['idx']}", "group_id": r["group_id"], "index": r["idx"],
            "prompt_id": r["prompt_id"], "dataset": r["dataset"], "policy_version": r["policy_version"],
            "group_status": r["group_status"], "reward_spec": spec, "prompt": messages(r["prompt_messages"]),
            "messages": messages(r["messages"]), "final_answer": r["final_answer"],
            "finish_reason": r["finish_reason"], "num_tokens": r["num_tokens"], "num_turns": r["num_turns"],
            "total_reward": r["total_reward"], "outcome": r["outcome"], "advantage": r["advantage"],
            "action": r["action"], "reason": r["reason"], "rewards": r.get("rewards") or [],
            "metadata": r["metadata"] or {},
        }


FORMATS = {"sft": sft, "dpo": dpo, "kto": kto, "rollouts": rollouts}

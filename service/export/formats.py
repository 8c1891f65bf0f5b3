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
- ``rollouts``: every stored trajectory with everything known about it (no filtering by finish reason),
  ``token_ids`` / ``logprobs`` / ``loss_mask`` included (numpy views of the stored bytes; null when not stored).
- ``verl``: one row per prompt of the matching groups, in verl's RL Parquet layout (``data_source``,
  ``prompt``, ``ability``, ``reward_model {style, ground_truth}``, ``extra_info {index, prompt_id, split,
  prompt, reference}``), each prompt once.
``min_reward`` applies to the exported trajectory (the SFT pick, the DPO ``chosen``, each KTO / rollout row).

Tool-call ``arguments``: with ``tool_arguments="object"`` (the default) a JSON object, as TRL's chat
templates (qwen2_5, llama3_1) iterate / ``tojson`` it; arguments that are not a JSON object (the model's
mistake), that do not read back exactly (a duplicate key, ``1e999``, a number with more digits than a float
keeps), or that no JSON writer can spell, stay the text the model wrote. ``"string"``: the stored JSON text.
The same options apply to every message written, a segmented trajectory's ``segments[].messages`` included.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from reward_models.text import json_depth_exceeds
from service.store import arrays

Row = dict[str, Any]
TOOL_ARGUMENTS = ("object", "string")


@dataclass
class Options:
    format: str
    min_reward: float | None = None
    correct_threshold: float = 1.0
    tool_arguments: str = "object"
    _seen: set[bytes] = field(default_factory=set)  # SFT / verl dedup: 16 bytes per written row
    _written: int = 0  # verl: the next extra_info.index


def arguments(value: Any, as_object: bool) -> Any:
    """One tool call's ``arguments`` as exported: the JSON object (``as_object``) when the stored value is
    one, or is JSON text of one that reads back exactly (``exact_object``); else the text as the model wrote it."""
    if not as_object:
        return _text(value)
    parsed = exact_object(value) if isinstance(value, str) else value
    if not isinstance(parsed, dict):
        return _text(value)
    try:
        orjson.dumps(parsed)  # an int over 64 bits: orjson (JSONL, the Parquet JSON column) cannot write it
    except (TypeError, orjson.JSONEncodeError):
        return _text(value)
    return parsed


class _Inexact(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # a duplicate key: which value the tool saw is the parser's choice
        raise _Inexact("duplicate key")
    return out


def _float(literal: str) -> float:
    value = float(literal)
    # 1e999 -> inf (no JSON); 0.1000000000000000000001 -> 0.1: a number the object would not say again
    if not math.isfinite(value) or Decimal(repr(value)) != Decimal(literal):
        raise _Inexact(f"number {literal[:40]} does not survive as a float")
    return value


def exact_object(text: str) -> dict[str, Any] | None:
    """The JSON object ``text`` spells, when reading it loses nothing: no duplicate key, no number a float
    changes (``1e999``, more digits than a double holds), no NaN / Infinity, no nesting past the model-JSON
    limit; else None (the export keeps the text)."""
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_float=_float, parse_constant=_refuse)
    except (ValueError, RecursionError):  # _Inexact, JSONDecodeError, an int over 4,300 digits
        return None
    if not isinstance(value, dict) or json_depth_exceeds(value):
        return None
    return value


def _refuse(name: str) -> Any:
    raise _Inexact(f"{name} is not JSON")


def message(m: dict[str, Any], as_object: bool = True) -> dict[str, Any]:
    """A stored message in the export's fixed shape (content as text; tool-call arguments per ``arguments``)."""
    content = m.get("content")
    calls = [
        {"id": c.get("id"), "type": c.get("type", "function"),
         "function": {"name": c["function"]["name"],
                      "arguments": arguments(c["function"].get("arguments", ""), as_object)}}
        for c in m.get("tool_calls") or []
    ]
    return {"role": m["role"], "content": content if isinstance(content, str) or content is None else _text(content),
            "tool_calls": calls or None, "tool_call_id": m.get("tool_call_id"), "name": m.get("name")}


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):  # an int over 64 bits (JSONB keeps any)
        import json

        return json.dumps(value)


def messages(ms: list[dict[str, Any]], opts: Options | None = None) -> list[dict[str, Any]]:
    as_object = opts is None or opts.tool_arguments == "object"
    return [message(m, as_object) for m in ms]


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
    convo = messages(best["prompt_messages"], opts) + messages(best["messages"], opts)
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
    yield {"prompt": messages(chosen["prompt_messages"], opts), "chosen": messages(chosen["messages"], opts),
           "rejected": messages(rejected["messages"], opts)}


def kto(rows: list[Row], opts: Options) -> Iterator[Row]:
    for r in _usable(rows):
        if r["outcome"] is not None and _passes(r, opts):
            yield {"prompt": messages(r["prompt_messages"], opts), "completion": messages(r["messages"], opts),
                   "label": r["outcome"] >= opts.correct_threshold}


def rollouts(rows: list[Row], opts: Options) -> Iterator[Row]:
    for r in rows:
        if not _passes(r, opts):
            continue
        spec = f"{r['reward_spec_name']}@{r['reward_spec_version']}" if r["reward_spec_name"] else None
        yield {
            "uid": f"{r['group_id']}/{r['idx']}", "group_id": r["group_id"], "index": r["idx"],
            "prompt_id": r["prompt_id"], "dataset": r["dataset"], "policy_version": r["policy_version"],
            "group_status": r["group_status"], "reward_spec": spec, "prompt": messages(r["prompt_messages"], opts),
            "messages": messages(r["messages"], opts), "final_answer": r["final_answer"],
            "finish_reason": r["finish_reason"], "num_tokens": r["num_tokens"], "num_turns": r["num_turns"],
            "total_reward": r["total_reward"], "outcome": r["outcome"], "advantage": r["advantage"],
            "action": r["action"], "reason": r["reason"], "rewards": r.get("rewards") or [],
            "metadata": r["metadata"] or {},
            "token_ids": arrays.decode(r.get("token_ids"), arrays.TOKEN_DTYPE),
            "logprobs": arrays.decode(r.get("logprobs"), arrays.LOGPROB_DTYPE),
            "loss_mask": arrays.decode(r.get("loss_mask"), arrays.MASK_DTYPE),
            "segments": _segments(r, opts),
        }


def _segments(r: Row, opts: Options) -> list[Row] | None:
    """A segmented trajectory's segments (index, is_last, token count, messages, advantage); None if not.
    The token arrays are the trajectory's, segments concatenated in order (``seq_len`` splits them); the
    top-level messages stay the whole episode."""
    segs = r.get("segments")
    if segs is None:
        return None
    advs = r.get("segment_advantages") or [None] * len(segs)
    return [{"segment_index": k, "is_last": k == len(segs) - 1, "seq_len": s["length"],
             "messages": None if s.get("messages") is None else messages(s["messages"], opts),
             "advantage": advs[k]}
            for k, s in enumerate(segs)]


def _chat(ms: list[dict[str, Any]]) -> list[dict[str, str]]:
    """verl's ``prompt``: role and text content only (what its RLHFDataset renders with the chat template)."""
    return [{"role": str(m.get("role")), "content": _content(m.get("content"))} for m in ms]


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def verl_ground_truth(reference: dict[str, Any]) -> tuple[str, str | None]:
    """(ability, ground truth text) for verl's ``reward_model.ground_truth``: ``answer`` as text (a list as
    its JSON text); else code: ``tests`` as the Python source, ``io`` as ``{"inputs": [...], "outputs": [...]}``
    JSON (the layout of verl's code datasets); None when the reference has none of them."""
    answer = reference.get("answer")
    if answer is not None:
        return "math", answer if isinstance(answer, str) else _text(answer)
    tests = reference.get("tests")
    if isinstance(tests, str):
        return "code", tests
    io = reference.get("io")
    if isinstance(io, list):
        cases = [c for c in io if isinstance(c, dict)]
        return "code", _text({"inputs": [c.get("input") for c in cases], "outputs": [c.get("output") for c in cases]})
    return "math", None


def verl(rows: list[Row], opts: Options) -> Iterator[Row]:
    """One verl RL row per prompt. ``extra_info`` carries what verl's reward loop hands a reward function
    and nothing else does: ``prompt`` (the chat messages; verl passes no prompt to ``compute_score``) and
    ``reference`` (the whole stored reference as JSON text, which the grpo-curator verl adapter scores
    with). ``ground_truth`` is never null for a prompt with a reference: the answer / tests / io text, else
    the reference's JSON text."""
    if not rows:
        return
    r = rows[0]  # every row of a group has its prompt
    key = hashlib.blake2b(r["prompt_id"].encode(), digest_size=16).digest()
    if key in opts._seen:
        return
    opts._seen.add(key)
    reference = r.get("prompt_reference") or {}
    ability, truth = verl_ground_truth(reference)
    if truth is None and reference:
        truth = _text(reference)
    metadata = r.get("prompt_metadata") or {}
    if isinstance(metadata.get("ability"), str):
        ability = metadata["ability"]
    index, opts._written = opts._written, opts._written + 1
    prompt = _chat(r["prompt_messages"])
    yield {"data_source": r["dataset"], "prompt": prompt, "ability": ability,
           "reward_model": {"style": "rule", "ground_truth": truth},
           "extra_info": {"index": index, "prompt_id": r["prompt_id"], "split": "train", "prompt": prompt,
                          "reference": _text(reference) if reference else None}}


FORMATS = {"sft": sft, "dpo": dpo, "kto": kto, "rollouts": rollouts, "verl": verl}

"""Small builders for reward-component tests."""

from __future__ import annotations

import json
import os
from typing import Any

from reward_models.base import PromptInfo, Sample


def make_sample(final_answer: str = "", **overrides: Any) -> Sample:
    """A one-turn trajectory whose assistant message is ``final_answer``."""
    fields: dict[str, Any] = {
        "messages": [{"role": "assistant", "content": final_answer}],
        "final_answer": final_answer,
        "finish_reason": "stop",
        "num_tokens": max(len(final_answer.split()), 1),
        "num_turns": 1,
    }
    fields.update(overrides)
    return Sample(**fields)


def make_prompt(reference: dict | None = None, **overrides: Any) -> PromptInfo:
    """A one-message prompt with ``reference``."""
    fields: dict[str, Any] = {
        "messages": [{"role": "user", "content": "What is 6 * 7?"}],
        "reference": reference if reference is not None else {"answer": "42"},
        "metadata": {},
        "dataset": "test",
    }
    fields.update(overrides)
    return PromptInfo(**fields)


def tool_call(name: str, arguments: Any, call_id: str = "c1") -> dict:
    """An OpenAI tool call; dict arguments are JSON-encoded, strings are kept as they are."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def agent_sample(calls: list[dict], final_answer: str = "done") -> Sample:
    """A trajectory with one assistant turn per tool call, each followed by a tool result."""
    messages: list[dict] = []
    for i, call in enumerate(calls):
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "content": "ok", "tool_call_id": call.get("id", f"c{i}")})
    messages.append({"role": "assistant", "content": final_answer})
    return Sample(messages, final_answer, "stop", 10 * (len(calls) + 1), len(calls) + 1)


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (to prove a process tree is gone)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found

"""Turning sampled completions into trajectories of the API's wire format.

Single-turn: prompt tokens (loss mask 0) + generated tokens (mask 1). Multi-turn with tools: each
assistant turn is generated (mask 1); a tool call ``<call>name(args)</call>`` in it runs a Python tool
from the registry, whose output is appended as observation tokens (mask 0) before the next turn.
Whose failure ends an episode decides how it is trained: a call to a tool that does not exist, or with
arguments the tool rejects (it raises one of ``TOOL_REJECTS``), is the model's mistake (``tool_misuse``:
scored like any failed answer); any other exception of a tool is the environment's (``tool_failure``:
never a negative). Hitting the turn budget ends it with ``max_turns``; the token budget in a turn with
``length``; an engine that gives up on a turn with ``aborted``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rollout.sampler import Completion, Sampler

# a tool raising one of these refused the arguments it was given (parse errors, wrong values, types)
TOOL_REJECTS: tuple[type[BaseException], ...] = (ValueError, TypeError, SyntaxError, ArithmeticError, KeyError)
TOOL_CALL = re.compile(r"<call>(\w+)\((.*?)\)</call>", re.DOTALL)


def single_turn(prompt_ids: list[int], c: Completion, text: str) -> dict[str, Any]:
    return {
        "messages": [{"role": "assistant", "content": text}],
        "final_answer": text,
        "token_ids": prompt_ids + c.tokens,
        "loss_mask": [0] * len(prompt_ids) + [1] * len(c.tokens),
        "logprobs": [0.0] * len(prompt_ids) + c.logprobs,
        "finish_reason": c.finish_reason,
    }


class _Episode:
    def __init__(self, prompt_ids: list[int]) -> None:
        self.ids, self.mask, self.logps = list(prompt_ids), [0] * len(prompt_ids), [0.0] * len(prompt_ids)
        self.messages: list[dict[str, Any]] = []

    def model_turn(self, c: Completion, text: str, call: re.Match[str] | None, turn: int) -> None:
        self.ids += c.tokens
        self.mask += [1] * len(c.tokens)
        self.logps += c.logprobs
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if call is not None:
            message["tool_calls"] = [{"id": f"call-{turn}", "type": "function",
                                      "function": {"name": call.group(1), "arguments": call.group(2)}}]
        self.messages.append(message)

    def observation(self, tokens: list[int], text: str, turn: int) -> None:
        self.ids += tokens
        self.mask += [0] * len(tokens)
        self.logps += [0.0] * len(tokens)
        self.messages.append({"role": "tool", "content": text, "tool_call_id": f"call-{turn}"})

    def done(self, finish_reason: str) -> dict[str, Any]:
        last = next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")
        return {"messages": self.messages, "final_answer": last, "token_ids": self.ids, "loss_mask": self.mask,
                "logprobs": self.logps, "finish_reason": finish_reason}


def multi_turn(
    sampler: Sampler,
    tokenizer: Any,
    prompt_ids: list[int],
    *,
    tools: dict[str, Callable[[str], str]],
    max_turns: int,
    max_tokens: int,
    seed: int,
    **sample_kwargs: Any,
) -> dict[str, Any]:
    """One episode of up to ``max_turns`` assistant turns with tool calls in between."""
    ep = _Episode(prompt_ids)
    for turn in range(max_turns):
        [c] = sampler.sample(ep.ids, 1, max_tokens, seed + turn, **sample_kwargs)
        text = tokenizer.decode([t for t in c.tokens if t != tokenizer.eos_token_id])
        call = TOOL_CALL.search(text) if c.finish_reason == "stop" else None
        ep.model_turn(c, text, call, turn)
        if c.finish_reason in ("length", "aborted"):  # cut by the budget, or given up by the engine
            return ep.done(c.finish_reason)
        if call is None:
            return ep.done("stop")
        name, args = call.group(1), call.group(2)
        if name not in tools:  # the model's mistake: a negative, not noise
            ep.observation([], f"unknown tool {name!r}", turn)
            return ep.done("tool_misuse")
        try:
            result = tools[name](args)
        except TOOL_REJECTS as exc:  # the tool refused the model's arguments: the model's mistake
            ep.observation([], f"error: {exc}", turn)
            return ep.done("tool_misuse")
        except Exception as exc:  # noqa: BLE001 - the tool itself failed on arguments it took: the environment's
            ep.observation([], f"error: {exc}", turn)
            return ep.done("tool_failure")
        try:
            obs = tokenizer.encode(result)
        except ValueError as exc:  # the environment produced what the policy cannot read
            ep.observation([], f"error: {exc}", turn)
            return ep.done("env_error")
        ep.observation(obs, result, turn)
    return ep.done("max_turns")

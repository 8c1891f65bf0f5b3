"""Turning sampled completions into trajectories of the API's wire format.

Single-turn: prompt tokens (loss mask 0) + generated tokens (mask 1). Multi-turn with tools: each
assistant turn is generated (mask 1); a tool call ``<call>name(args)</call>`` in it runs a Python tool
from the registry, whose output is appended as observation tokens (mask 0) before the next turn.
Whose failure ends an episode decides how it is trained, and the arguments decide it (``rollout.tools``): a
call to a tool that does not exist, with arguments that fail the tool's check before it runs (not JSON,
against its schema, not binding to its signature), or that the tool explicitly refuses (it raises
``ToolArgumentError``) is the model's mistake (``tool_misuse``: scored as a failed outcome); any other
exception while a tool runs on arguments that passed is the environment's (``tool_failure``: never a
negative), whatever its type (a backend's bad JSON is a ``ValueError``, a missing key a ``KeyError``). Hitting the turn budget ends it with ``max_turns``; the token budget in a turn with
``length``; an engine that gives up on a turn with ``aborted``.

Every trajectory carries per-token ``versions`` (the policy version that generated each token, -1 for
prompt and tool-result tokens) and a checkpoint marker at its last turn boundary, ``metadata.checkpoint``
``{"tokens", "messages"}``: the lengths of the token arrays and the messages before the turn that was cut
(after the last tool result), or the whole episode when every turn completed (``max_turns``). The service
stores it with the trajectory (durable: PostgreSQL), and a ``resume`` request hands the state back
(``continue_episode``): the episode goes on from there under the current policy, and no tool runs again --
the checkpoint holds the tool results as tokens and messages. That is only valid when the environment's
whole state is in the checkpoint (pure tools, as here); an environment with state outside the transcript
(a sandbox's files, a browser) cannot be resumed this way and should use resample.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rollout.sampler import Completion, Sampler
from rollout.tools import ToolArgumentError, ToolLike, prepare

TOOL_CALL = re.compile(r"<call>(\w+)\((.*?)\)</call>", re.DOTALL)


def single_turn(prompt_ids: list[int], c: Completion, text: str, version: int | None = None) -> dict[str, Any]:
    out = {
        "messages": [{"role": "assistant", "content": text}],
        "final_answer": text,
        "token_ids": prompt_ids + c.tokens,
        "loss_mask": [0] * len(prompt_ids) + [1] * len(c.tokens),
        "logprobs": [0.0] * len(prompt_ids) + c.logprobs,
        "finish_reason": c.finish_reason,
    }
    if version is not None:
        out["versions"] = [-1] * len(prompt_ids) + [version] * len(c.tokens)
    return out


class _Episode:
    def __init__(self, prompt_ids: list[int], version: int = 0) -> None:
        self.ids, self.mask, self.logps = list(prompt_ids), [0] * len(prompt_ids), [0.0] * len(prompt_ids)
        self.versions = [-1] * len(prompt_ids)
        self.version = version
        self.messages: list[dict[str, Any]] = []
        self.boundary = (len(self.ids), 0)  # (tokens, messages) at the last turn boundary
        self.no_logprobs = False

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any], version: int) -> _Episode:
        """The state a ``resume`` request carries; the episode goes on under ``version``."""
        ep = cls([], version)
        ep.ids = [int(t) for t in checkpoint["token_ids"]]
        ep.mask = [int(m) for m in checkpoint["loss_mask"]]
        logps = checkpoint.get("logprobs")
        ep.logps = [float(v) for v in logps] if logps is not None else [0.0] * len(ep.ids)
        ep.no_logprobs = logps is None  # the continuation posts none rather than zeros for the old tokens
        ep.versions = [int(v) for v in checkpoint.get("versions") or [-1] * len(ep.ids)]
        ep.messages = list(checkpoint.get("messages") or [])
        ep.boundary = (len(ep.ids), len(ep.messages))
        return ep

    def mark(self) -> None:
        """A turn boundary: everything so far is complete (the durable checkpoint of this episode)."""
        self.boundary = (len(self.ids), len(self.messages))

    def model_turn(self, c: Completion, text: str, call: re.Match[str] | None, turn: int) -> None:
        self.ids += c.tokens
        self.mask += [1] * len(c.tokens)
        self.logps += c.logprobs
        self.versions += [self.version] * len(c.tokens)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if call is not None:
            message["tool_calls"] = [{"id": f"call-{turn}", "type": "function",
                                      "function": {"name": call.group(1), "arguments": call.group(2)}}]
        self.messages.append(message)

    def observation(self, tokens: list[int], text: str, turn: int) -> None:
        self.ids += tokens
        self.mask += [0] * len(tokens)
        self.logps += [0.0] * len(tokens)
        self.versions += [-1] * len(tokens)
        self.messages.append({"role": "tool", "content": text, "tool_call_id": f"call-{turn}"})

    def done(self, finish_reason: str) -> dict[str, Any]:
        last = next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")
        if finish_reason == "max_turns":
            self.mark()  # every turn completed: the whole episode is the last complete state
        tokens, messages = self.boundary
        return {"messages": self.messages, "final_answer": last, "token_ids": self.ids, "loss_mask": self.mask,
                "logprobs": None if self.no_logprobs else self.logps, "versions": self.versions, "finish_reason": finish_reason,
                "metadata": {"checkpoint": {"tokens": tokens, "messages": messages}}}


def multi_turn(
    sampler: Sampler,
    tokenizer: Any,
    prompt_ids: list[int],
    *,
    tools: Mapping[str, ToolLike],
    max_turns: int,
    max_tokens: int,
    seed: int,
    version: int = 0,
    **sample_kwargs: Any,
) -> dict[str, Any]:
    """One episode of up to ``max_turns`` assistant turns with tool calls in between; ``version``: the
    policy version of the sampler (each generated token's ``versions`` entry)."""
    return _run(_Episode(prompt_ids, version), sampler, tokenizer, tools, max_turns, max_tokens, seed, 0,
                **sample_kwargs)


def continue_episode(
    sampler: Sampler,
    tokenizer: Any,
    checkpoint: dict[str, Any],
    *,
    tools: Mapping[str, ToolLike],
    max_turns: int,
    max_tokens: int,
    seed: int,
    version: int,
    **sample_kwargs: Any,
) -> dict[str, Any]:
    """Resume an episode from its checkpoint (a ``resume`` request's) for up to ``max_turns`` more turns
    under ``version``; no tool of the checkpoint runs again (its results are in the checkpoint)."""
    ep = _Episode.from_checkpoint(checkpoint, version)
    done = sum(1 for m in ep.messages if m.get("role") == "assistant")
    return _run(ep, sampler, tokenizer, tools, max_turns, max_tokens, seed, done, **sample_kwargs)


def _run(ep: _Episode, sampler: Sampler, tokenizer: Any, tools: Mapping[str, ToolLike], max_turns: int,
         max_tokens: int, seed: int, first: int, **sample_kwargs: Any) -> dict[str, Any]:
    """Turns ``first`` .. ``first + max_turns - 1`` of an episode (tool call ids stay unique)."""
    for turn in range(first, first + max_turns):
        ep.mark()
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
            result = prepare(tools[name], args)()
        except ToolArgumentError as exc:  # checked before it ran, or refused by the tool: the model's mistake
            ep.observation([], f"error: {exc}", turn)
            return ep.done("tool_misuse")
        except Exception as exc:  # noqa: BLE001 - the tool failed on arguments that passed: the environment's
            ep.observation([], f"error: {exc}", turn)
            return ep.done("tool_failure")
        try:
            obs = tokenizer.encode(result)
        except ValueError as exc:  # the environment produced what the policy cannot read
            ep.observation([], f"error: {exc}", turn)
            return ep.done("env_error")
        ep.observation(obs, result, turn)
    return ep.done("max_turns")

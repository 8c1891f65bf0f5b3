"""How a session's record says its episode stands at finish, and which ``finish_reason`` an agent may claim
against it (docs/agents.md, "What the agent may claim at finish").

A cut (``length``, ``max_turns``) is masked, resampled or resumed by curation and an environment failure
(``tool_failure``, ``env_error``, ``timeout``, ``aborted``) is dropped: neither is ever a negative. So a claim
of one is taken only where the gateway's record does not contradict it:

- ``length``: the last answered completion was cut at its ``max_tokens`` (the upstream's ``finish_reason``
  ``length``), the session's tokens reached ``session_max_tokens``, or the session's last call, after the last
  answer, was answered with nothing generated (the upstream refused it: a prompt past the model's context).
- ``max_turns`` and the environment's reasons: unless the record shows the model ended its episode itself
  (``Record.final``): its last call is an answered message with no tool calls, not cut, in a session that
  offered ``tools`` (so the gateway sees the model's tool calls) and whose environment never went on after
  such a message (a conversation: a user simulator, feedback turns).

Where the gateway cannot see the model's tool calls (no call offered ``tools``: the completions route, an
agent that parses tool calls out of the text) nothing contradicts ``max_turns`` or an environment failure;
``length`` is checked on every route.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from filters.types import ENVIRONMENT_REASONS
from service.api.errors import BadRequest
from service.sessions.repository import SEGMENT_MARK, calls

CUT_FINISH = "length"  # the upstream's finish_reason for a completion cut at its max_tokens
CUT_REASONS = frozenset({"length", "max_turns"})
UNFINISHED = frozenset({CUT_FINISH, "tool_calls", "abort"})  # upstream finish_reasons of no final word


@dataclass(frozen=True)
class Record:
    """What a session's calls say about how its episode stands (segment marks are no calls)."""

    answered: bool  # the model generated something
    last_index: int | None = None  # the last answered call
    last_finish: str | None = None  # its upstream finish_reason
    wants_more: bool = False  # it asked for tool calls, or was cut at its max_tokens
    later: bool = False  # a call came after it (refused by the upstream, failed, or still in flight)
    refused: bool = False  # the upstream refused the call after an answer that wanted more (the upstream's 4xx)
    sees_tools: bool = False  # a call offered tools: the gateway sees the model's tool calls
    converses: bool = False  # the environment went on after a message without tool calls

    @property
    def cut(self) -> bool:
        return self.last_finish == CUT_FINISH

    @property
    def final(self) -> bool:
        """The model ended its episode: its last answered word is a message without tool calls, not cut, and
        nothing the session did says its environment would have gone on (no answered call followed such a
        message). A call after it that was not answered -- in flight, refused, failed, or dead with a killed
        API -- changes nothing: the model's answer stands."""
        return self.answered and self.sees_tools and not (self.wants_more or self.converses)


def _answer(c: Any) -> dict[str, Any] | None:
    """The call's answered message ({"content"} for a completion), None when it generated nothing."""
    if c.completion_ids is None or c.response is None:
        return None
    message = c.response.get("message")
    return message if isinstance(message, dict) else {}


def _wants_more(c: Any, message: dict[str, Any]) -> bool:
    """The answer is no final word: it asked for tools, or was cut at its max_tokens or aborted."""
    return bool(message.get("tool_calls")) or c.finish_reason in UNFINISHED


def record(calls: Sequence[Any]) -> Record:
    """The record of a session's calls (``SessionCall`` rows in index order)."""
    made = [c for c in calls if c.kind != SEGMENT_MARK]
    answered = [(i, c, m) for i, c in enumerate(made) if (m := _answer(c)) is not None]
    if not answered:
        return Record(answered=False)
    pos, last, message = answered[-1]
    sees_tools = any(c.kind == "chat" and (c.request or {}).get("tools") for c in made)
    # the environment went on after a message without tool calls: an *answered* call came after it (a call
    # in flight, refused or failed is no answer: it never undoes the model's final word)
    converses = any(not _wants_more(c, m) for i, c, m in answered[:-1])
    later = pos < len(made) - 1
    wants_more = _wants_more(last, message)
    # the upstream refused the call that followed an answer that wanted more (a prompt past the context): a
    # cut; a refusal after a final answer is the agent's extra call, nothing the model did
    refused = later and made[-1].attempts > 0 and wants_more
    return Record(answered=True, last_index=last.idx, last_finish=last.finish_reason, wants_more=wants_more,
                  later=later, refused=refused, sees_tools=sees_tools, converses=converses)


def allowed(r: Record, tokens_reached: bool) -> list[str]:
    """The reasons the record allows an agent to claim (``stop`` and ``tool_misuse``, the model's, always)."""
    out = ["stop", "tool_misuse"]
    if r.cut or tokens_reached or r.refused:
        out.append("length")
    if not r.final:
        out += ["max_turns", *sorted(ENVIRONMENT_REASONS)]
    return out


def settled(reason: str, r: Record) -> str:
    """The reason a session ends with when the gateway or the deadline ends it (a limit, the upstream failing,
    the group's deadline): after the model's final answer (``Record.final``) a cut or an environment failure
    can only have hit what came after it -- the agent's extra calls, or time -- so the episode ends as
    ``stop`` and its answer is scored; otherwise ``reason``."""
    if r.final and (reason in ENVIRONMENT_REASONS or reason in CUT_REASONS):
        return "stop"
    return reason


def settle(db: Any, row: Any, reason: str) -> str:
    """How the gateway or the deadline ends session ``row`` it would end as ``reason``: ``tool_misuse`` when
    its calls showed one (the model's failure wins over whatever ends it), else ``settled`` on its record."""
    if row.misuse is not None:
        return "tool_misuse"
    return settled(reason, record(calls(db, row.id)))


def check_claim(claimed: str | None, r: Record, tokens_reached: bool, named: str | None = None) -> None:
    """A 422 naming ``finish_reason`` when the record contradicts the claimed reason (``named``: how the claim
    was made when not by ``finish_reason``: an ``error`` without a reason claims ``env_error``)."""
    if claimed is None or claimed in ("stop", "tool_misuse"):
        return
    ok = allowed(r, tokens_reached)
    if claimed in ok:
        return
    if claimed == "length":
        why = (f"its last answered call ({r.last_index}) ended with finish_reason {r.last_finish!r}, not cut at "
               "its max_tokens, the upstream refused no call after it, and its tokens are below "
               "GRPO_CURATOR_SESSION_MAX_TOKENS")
    else:
        why = (f"its last call ({r.last_index}) is the model's final answer (finish_reason {r.last_finish!r}, no "
               "tool calls, in a session that offers tools): the model ended its episode, nothing cut it and no "
               "environment failure can have")
    raise BadRequest(f"finish_reason: {named or repr(claimed)} contradicts the session's record: {why}; claim "
                     f"one of {ok}, or leave finish_reason out to score the model's last completion (the session "
                     "stays open)",
                     status_code=422, detail={"field": "finish_reason", "claimed": claimed, "allowed": ok,
                                              "last_call": r.last_index, "last_finish_reason": r.last_finish})

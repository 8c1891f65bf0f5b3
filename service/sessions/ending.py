"""How a session's record says its episode stands at finish, and which ``finish_reason`` an agent may claim
against it (docs/agents.md, "What the agent may claim at finish").

A cut (``length``, ``max_turns``) is masked, resampled or resumed by curation and an environment failure
(``tool_failure``, ``env_error``, ``timeout``, ``aborted``) is dropped: neither is ever a negative. So a claim
of one is taken only where the gateway's record does not contradict it.

The episode's last word (``Record.last_index``) is read off the calls in order. After an answer that wants
more (tool calls, cut at its ``max_tokens``, aborted) every later call continues the episode. After a *plain
answer* (no tool calls, stopped by itself) only a call that **goes on from it** does: its history is that
answer's history, the answer itself, then a new turn of the environment (chat: the same messages, an
assistant message with the answer's text, then at least one message that is not the assistant's -- the
user simulator's turn, feedback; completions: the same prompt with the answer's text or ids, then more). Any
other call after it -- the same prompt again, a ``max_tokens=1`` or padded call, a rewritten history, a call
after a segment mark -- is an extra call of the agent: answered or not, it changes nothing, so it cannot
make the answer look cut, unfinished or followed by an environment that failed.

- ``length``: the episode's last word was cut at its ``max_tokens`` (the upstream's ``finish_reason``
  ``length``), the session's tokens reached ``session_max_tokens``, or the upstream refused (a prompt past
  the model's context) the session's last call, which continued the episode.
- ``max_turns`` and the environment's reasons: unless the model gave its final answer (``Record.final_for``):
  the last word is a plain answer that nothing went on from, and either the agent says so (a
  ``final_answer`` at finish: it submits that answer, so nothing can have cut the episode before it) or the
  gateway sees it (a call offered ``tools``, so a plain answer is no tool call, and the environment never
  went on after a plain answer: no conversation). In a conversation (a user simulator, feedback turns) or
  where the gateway cannot see tool calls (no ``tools``: the completions route, tool calls parsed out of the
  text) a plain answer may be a turn whose environment failed, unless the agent submits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from filters.types import ENVIRONMENT_REASONS
from service.api.errors import BadRequest
from service.sessions.repository import SEGMENT_MARK
from service.sessions.repository import calls as session_calls
from service.store import arrays

CUT_FINISH = "length"  # the upstream's finish_reason for a completion cut at its max_tokens
CUT_REASONS = frozenset({"length", "max_turns"})
UNFINISHED = frozenset({CUT_FINISH, "tool_calls", "abort"})  # upstream finish_reasons of no final word


@dataclass(frozen=True)
class Record:
    """What a session's calls say about how its episode stands (segment marks are no calls)."""

    answered: bool  # the model generated something
    last_index: int | None = None  # the episode's last word: the last answered call, less extra calls
    last_finish: str | None = None  # its upstream finish_reason
    wants_more: bool = False  # it asked for tool calls, or was cut at its max_tokens, or aborted
    went_on: bool = False  # a call went on from it (a plain answer) and was not answered: the episode went on
    refused: bool = False  # the upstream refused the session's last call, which continued the episode
    sees_tools: bool = False  # a call offered tools: the gateway sees the model's tool calls
    converses: bool = False  # the environment went on after a plain answer (the model answered it again)

    @property
    def cut(self) -> bool:
        return self.last_finish == CUT_FINISH

    @property
    def plain(self) -> bool:
        """The last word is a plain answer that nothing went on from."""
        return self.answered and not (self.wants_more or self.went_on)

    @property
    def final(self) -> bool:
        """The record alone shows the model ended its episode: a plain answer nothing went on from, in a
        session that offers tools and never conversed. Extra calls after it -- answered or not -- change
        nothing: the model's answer stands."""
        return self.plain and self.sees_tools and not self.converses

    def final_for(self, submitted: bool) -> bool:
        """``final``, or the agent submits the last word as the model's answer (``submitted``: a
        ``final_answer`` at finish) and it is a plain answer nothing went on from."""
        return self.final or (submitted and self.plain)


def _answer(c: Any) -> dict[str, Any] | None:
    """The call's answered message ({"content"} for a completion), None when it generated nothing."""
    if c.completion_ids is None or c.response is None:
        return None
    message = c.response.get("message")
    return message if isinstance(message, dict) else {}


def _wants_more(c: Any, message: dict[str, Any]) -> bool:
    """The answer is no final word: it asked for tools, or was cut at its max_tokens or aborted."""
    return bool(message.get("tool_calls")) or c.finish_reason in UNFINISHED


def _text(content: Any) -> str:
    """A message's text: its ``content`` string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _goes_on_chat(answer: Any, text: str, later: Any) -> bool:
    history, after = (answer.request or {}).get("messages"), (later.request or {}).get("messages")
    if not isinstance(history, list) or not isinstance(after, list) or len(after) < len(history) + 2:
        return False
    echoed = after[len(history)]
    if after[:len(history)] != history or not isinstance(echoed, dict) or echoed.get("role") != "assistant":
        return False
    if _text(echoed.get("content")).strip() != text.strip():
        return False
    return any(isinstance(m, dict) and m.get("role") != "assistant" for m in after[len(history) + 1:])


def _goes_on_completion(answer: Any, text: str, later: Any) -> bool:
    prompt, after = (answer.request or {}).get("prompt"), (later.request or {}).get("prompt")
    if isinstance(prompt, str) and isinstance(after, str):
        return len(after) > len(prompt + text) and after.startswith(prompt + text)
    if isinstance(prompt, list) and isinstance(after, list):
        done = prompt + (arrays.decode_list(answer.completion_ids, arrays.TOKEN_DTYPE) or [])
        return len(after) > len(done) and after[:len(done)] == done
    return False


def goes_on(answer: Any, message: dict[str, Any], later: Any) -> bool:
    """Whether call ``later`` goes on from the plain answer of call ``answer`` (its ``message``): its history
    is the answer's, then the answer, then a new turn of the environment."""
    if answer.kind != later.kind:
        return False
    text = _text(message.get("content"))
    return (_goes_on_chat if answer.kind == "chat" else _goes_on_completion)(answer, text, later)


def record(calls: Sequence[Any]) -> Record:
    """The record of a session's calls (``SessionCall`` rows in index order)."""
    made = [c for c in calls if c.kind != SEGMENT_MARK]
    last, said = None, {}  # the episode's last word (an answered call) and its message
    went_on = converses = refused = False
    for c in made:
        plain = last is not None and not _wants_more(last, said)
        if plain and not goes_on(last, said, c):
            continue  # an extra call after a plain answer, answered or not: it changes nothing
        message = _answer(c)
        if message is None:  # not answered: refused, failed, in flight, or left by a killed API
            went_on = went_on or plain  # the environment's turn after a plain answer, unanswered
            refused = last is not None and c.attempts > 0 and c is made[-1]
            continue
        converses = converses or plain  # the environment went on after a plain answer, the model answered
        last, said, went_on, refused = c, message, False, False
    if last is None:
        return Record(answered=False)
    sees_tools = any(c.kind == "chat" and (c.request or {}).get("tools") for c in made)
    return Record(answered=True, last_index=last.idx, last_finish=last.finish_reason,
                  wants_more=_wants_more(last, said), went_on=went_on, refused=refused, sees_tools=sees_tools,
                  converses=converses)


def allowed(r: Record, tokens_reached: bool, submitted: bool = False) -> list[str]:
    """The reasons the record allows an agent to claim (``stop`` and ``tool_misuse``, the model's, always);
    ``submitted``: the agent sends a ``final_answer`` with the claim."""
    out = ["stop", "tool_misuse"]
    if r.cut or tokens_reached or r.refused:
        out.append("length")
    if not r.final_for(submitted):
        out += ["max_turns", *sorted(ENVIRONMENT_REASONS)]
    return out


def settled(reason: str, r: Record) -> str:
    """The reason a session ends with when the gateway or the deadline ends it (a limit, the upstream failing,
    the group's deadline): after the model's final answer (``Record.final``) a cut or an environment failure
    can only have hit what came after it -- the agent's extra calls, or time -- so the episode ends as
    ``stop`` and its answer is scored; otherwise ``reason`` (a call that went on from a plain answer and
    failed is the environment's turn failing: ``env_error``, dropped)."""
    if r.final and (reason in ENVIRONMENT_REASONS or reason in CUT_REASONS):
        return "stop"
    return reason


def settle(db: Any, row: Any, reason: str) -> str:
    """How the gateway or the deadline ends session ``row`` it would end as ``reason``: ``tool_misuse`` when
    its calls showed one (the model's failure wins over whatever ends it), else ``settled`` on its record."""
    if row.misuse is not None:
        return "tool_misuse"
    return settled(reason, record(session_calls(db, row.id)))


def check_claim(claimed: str | None, r: Record, tokens_reached: bool, named: str | None = None,
                submitted: bool = False) -> None:
    """A 422 naming ``finish_reason`` when the record contradicts the claimed reason (``named``: how the claim
    was made when not by ``finish_reason``: an ``error`` without a reason claims ``env_error``; ``submitted``:
    the agent sends a ``final_answer`` with it)."""
    if claimed is None or claimed in ("stop", "tool_misuse"):
        return
    ok = allowed(r, tokens_reached, submitted)
    if claimed in ok:
        return
    if claimed == "length":
        why = (f"the episode's last answer (call {r.last_index}) ended with finish_reason {r.last_finish!r}, not "
               "cut at its max_tokens, the upstream refused no call that continued it, and its tokens are below "
               "GRPO_CURATOR_SESSION_MAX_TOKENS (a call that does not go on from a plain answer is an extra call "
               "and changes nothing)")
    elif r.final:
        why = (f"call {r.last_index} is the model's final answer (finish_reason {r.last_finish!r}, no tool calls, "
               "in a session that offers tools, and no call went on from it with a turn of the environment): the "
               "model ended its episode, nothing cut it and no environment failure can have")
    else:
        why = (f"final_answer submits call {r.last_index}'s answer (finish_reason {r.last_finish!r}, no tool "
               "calls, no call went on from it) as the model's: the model ended its episode, nothing cut it and "
               "no environment failure can have (leave final_answer out to claim one)")
    raise BadRequest(f"finish_reason: {named or repr(claimed)} contradicts the session's record: {why}; claim "
                     f"one of {ok}, or leave finish_reason out to score the model's last completion (the session "
                     "stays open)",
                     status_code=422, detail={"field": "finish_reason", "claimed": claimed, "allowed": ok,
                                              "last_call": r.last_index, "last_finish_reason": r.last_finish})

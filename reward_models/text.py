"""Plain-text helpers shared by components: transcripts, tool calls, code blocks, QA normalisation.

Everything here reads model output, which is hostile (docs/components.md, "Low score or error"): a
message part whose ``text`` is not a string, content that is neither a string nor a list, a message
that is not an object, tool calls that are not a list, JSON nested thousands deep or holding a
5,000-digit integer, lone surrogates. These helpers never raise on such input: they read it as "no
text" / "not JSON", which the components score as the model's mistake, never as an error.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from typing import Any

from reward_models.base import Sample

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_SURROGATE = re.compile("[\ud800-\udfff]")

# JSON the model wrote (tool-call arguments, a JSON answer) nested deeper than this is "not JSON": the
# parser, the validators and the encoders that meet it later all recurse, and fail at a few hundred levels
MAX_MODEL_JSON_DEPTH = 100


class NotJson(ValueError):
    """Model text that is not plain JSON; the message says why (for a component's details)."""


def _refuse_constant(name: str) -> Any:
    raise NotJson(f"{name} is not JSON")


def parse_model_json(text: str, max_depth: int = MAX_MODEL_JSON_DEPTH) -> Any:
    """``json.loads`` for text the model wrote: NotJson (never another error) for anything that is not
    plain JSON: a syntax error, NaN / Infinity (NaN passes every ``minimum``), an integer over Python's
    4,300 digits, nesting deeper than ``max_depth`` (the parser's own RecursionError included)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except NotJson:
        raise
    except json.JSONDecodeError as exc:
        raise NotJson(f"{exc.msg} at char {exc.pos}") from None
    except RecursionError:
        raise NotJson("nested too deeply") from None
    except ValueError as exc:  # an integer over sys.get_int_max_str_digits() digits
        raise NotJson(str(exc)[:200]) from None
    if json_depth_exceeds(value, max_depth):
        raise NotJson(f"nested deeper than {max_depth} levels")
    return value


def json_depth_exceeds(value: Any, max_depth: int = MAX_MODEL_JSON_DEPTH) -> bool:
    """Are lists / dicts nested deeper than ``max_depth`` in ``value``? (no recursion: any depth is safe)"""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def canonical_json(value: Any) -> str | None:
    """``value`` as JSON with sorted keys, or None when it cannot be written (too deep, an integer over
    4,300 digits, a key or value JSON has no spelling for)."""
    if json_depth_exceeds(value):
        return None
    try:
        return json.dumps(value, sort_keys=True)
    except (RecursionError, ValueError, TypeError):
        return None


def utf8_safe(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8 cannot encode) replaced by U+FFFD, for what is sent
    over HTTP or tokenised; other text is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def part_text(part: Any) -> str:
    """The text of one content part: a ``{"type": "text", "text": str}`` part's text, else ""."""
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    return ""


def content_text(message: Any) -> str:
    """The text of one chat message; list-of-parts content keeps only the text parts. A message that
    is not an object, content that is neither a string nor a list, a part whose text is not a string:
    no text."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part_text(p) for p in content)
    return ""


def message_role(message: Any) -> str | None:
    """The role of one chat message when it is a string, else None."""
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) else None


def render_messages(messages: list[dict]) -> str:
    """Messages as ``"role: content"`` lines, for judges and reward models without a chat template."""
    return "\n".join(f"{message_role(m) or 'user'}: {content_text(m)}" for m in messages)


def assistant_text(sample: Sample) -> str:
    """All assistant contents of a trajectory joined by newlines (the model-generated text)."""
    texts = [content_text(m) for m in sample.messages if message_role(m) == "assistant"]
    return "\n".join(t for t in texts if t) or sample.final_answer


def tool_calls(sample: Sample) -> list[Any]:
    """Every tool call the assistant made, in order (OpenAI ``tool_calls`` entries, as the model wrote
    them: a consumer checks each one's shape). A ``tool_calls`` that is not a list is one (malformed) call."""
    calls: list[Any] = []
    for message in sample.messages:
        if message_role(message) == "assistant":
            made = message.get("tool_calls")
            if isinstance(made, list):
                calls.extend(made)
            elif made:
                calls.append(made)
    return calls


def extract_code(text: str) -> str:
    """The last fenced python block of ``text``, else the whole text."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation: lower case, drop punctuation and articles, squeeze spaces.

    Rajpurkar et al. 2016 (SQuAD), official evaluation script.
    """
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """Token-level F1 between normalised prediction and reference (SQuAD, Rajpurkar et al. 2016).

    Both empty -> 1.0; one empty -> 0.0.
    """
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)

"""Plain-text helpers shared by components: transcripts, tool calls, code blocks, QA normalisation."""

from __future__ import annotations

import re
import string
from collections import Counter

from reward_models.base import Sample

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def content_text(message: dict) -> str:
    """The text of one chat message; list-of-parts content keeps only the text parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return "".join(parts)


def render_messages(messages: list[dict]) -> str:
    """Messages as ``"role: content"`` lines, for judges and reward models without a chat template."""
    return "\n".join(f"{m.get('role', 'user')}: {content_text(m)}" for m in messages)


def assistant_text(sample: Sample) -> str:
    """All assistant contents of a trajectory joined by newlines (the model-generated text)."""
    texts = [content_text(m) for m in sample.messages if m.get("role") == "assistant"]
    return "\n".join(t for t in texts if t) or sample.final_answer


def tool_calls(sample: Sample) -> list[dict]:
    """Every tool call the assistant made, in order (OpenAI ``tool_calls`` entries)."""
    calls: list[dict] = []
    for message in sample.messages:
        if message.get("role") == "assistant":
            calls.extend(message.get("tool_calls") or [])
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

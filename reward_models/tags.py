"""The one reading of R1-style tags (``<think>...</think><answer>...</answer>``, DeepSeek-R1, Guo et al. 2025)
that ``verifier.math`` and ``rule.format`` share.

The rule (docs/components.md, "Tags"):
- **Tag names match ASCII case-insensitively**: ``<ANSWER>`` is ``<answer>``. Only ``A-Z`` fold (tag names are
  ASCII by validation), so the folded text has the same length as the original and every index found in it
  is an index of the original: a character whose lowercase is longer (``İ`` -> ``i̇``) cannot shift a slice.
- **The answer follows the reasoning**: an answer tag counts only in the *answer region*, the text after the
  last ``</think>`` and before any ``<think>`` opened after it (a think block never closed is reasoning to the
  end). An ``<answer>`` written inside ``<think>...</think>`` is reasoning, never the answer.

Every function is a few ``find`` / ``rfind`` scans: linear on any input, however many tags it holds.
"""

from __future__ import annotations

import string

THINK_TAG = "think"
_ASCII_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def fold(text: str) -> str:
    """``text`` with ASCII ``A-Z`` lowered and nothing else changed: same length, same indices."""
    return text.translate(_ASCII_FOLD)


def answer_region(folded: str, think: str | None = THINK_TAG, starts_in_think: bool = False) -> tuple[int, int]:
    """``(lo, hi)``: the answer region of an already ``fold``-ed text (everything when ``think`` is None).

    ``starts_in_think``: the text begins inside an open think block (the chat template ended the prompt with
    ``<think>``, as DeepSeek-R1-Distill's and Qwen3's do), so without a ``</think>`` all of it is reasoning."""
    if think is None:
        return 0, len(folded)
    opener, closer = f"<{fold(think)}>", f"</{fold(think)}>"
    close = folded.rfind(closer)
    if close < 0 and starts_in_think:
        return len(folded), len(folded)
    lo = close + len(closer) if close >= 0 else 0
    unclosed = folded.find(opener, lo)
    return lo, unclosed if unclosed >= 0 else len(folded)


def tagged_span(text: str, tag: str, think: str | None = THINK_TAG, starts_in_think: bool = False) -> str | None:
    """The content of the last complete ``<tag>...</tag>`` in the answer region of ``text``, else None.

    The span ends at the region's last closing tag and starts after the last tag (opening or closing) before
    it, so it never holds a tag: several answers -> the last one; nested or stray tags -> the text right
    before the last closing tag; an opening tag that is never closed is no answer."""
    folded = fold(text)
    lo, hi = answer_region(folded, think, starts_in_think)
    opener, closer = f"<{fold(tag)}>", f"</{fold(tag)}>"
    close = folded.rfind(closer, lo, hi)
    if close < 0:
        return None
    start = folded.rfind(opener, lo, close)
    if start < 0:
        return None
    inner_close = folded.rfind(closer, start, close)
    begin = inner_close + len(closer) if inner_close >= 0 else start + len(opener)
    return text[begin:close]


def outside_reasoning(text: str, think: str | None = THINK_TAG, starts_in_think: bool = False) -> str:
    """The answer region of ``text`` (what an answer may be read from when no answer tag is found)."""
    lo, hi = answer_region(fold(text), think, starts_in_think)
    return text[lo:hi]

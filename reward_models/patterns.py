"""User-supplied regexes (``rule.format`` ``pattern``, ``extract_pattern``): linear time where possible.

A pattern runs on RE2 (the ``google-re2`` package: linear in the text, no catastrophic backtracking)
when RE2 accepts it and reads it as Python's ``re`` does. RE2 differs from ``re`` on ``$`` (``re``
also matches before a final newline), on ``\\d \\w \\s \\b`` and their negations (Unicode in ``re``,
ASCII in RE2), on ``\\Z`` and on case folding; a pattern with any of these, or one RE2 rejects
(backreferences, lookaround, atomic groups), keeps ``re`` and its component runs in the killable pool
under the component deadline instead (``linear`` is False). The test is deliberately coarse: a false
"not linear" only costs a pool round trip, never a different answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_DIVERGENT = re.compile(r"\$|\\[dDwWsSbBZ]|\(\?[a-zA-Z]*i")


def _re2(pattern: str) -> Any | None:
    """The RE2 program for ``pattern`` (dot matches newline, as in ``re.DOTALL``), or None."""
    if _DIVERGENT.search(pattern):
        return None
    try:
        import re2
    except ImportError:  # the pool still bounds the time
        return None
    try:
        return re2.compile("(?s)" + pattern)
    except Exception:  # noqa: BLE001 - re2 raises its own error type for unsupported syntax
        return None


class UserPattern:
    """A validated user regex with ``re.DOTALL``; ValueError (naming the problem) if ``re`` rejects it."""

    def __init__(self, pattern: str) -> None:
        try:
            self._re = re.compile(pattern, re.DOTALL)
        except (re.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"invalid regex: {exc}") from None
        self.pattern = pattern
        self._linear = _re2(pattern)

    @property
    def linear(self) -> bool:
        """True when matching runs on RE2 (linear time); False: Python ``re``, run under a deadline."""
        return self._linear is not None

    @property
    def groups(self) -> int:
        return self._re.groups

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self._re.groupindex)

    def _engine(self) -> Any:
        return self._linear if self._linear is not None else self._re

    def search(self, text: str) -> Any:
        return self._engine().search(text)

    def fullmatch(self, text: str) -> Any:
        return self._engine().fullmatch(text)

    def finditer(self, text: str) -> Iterator[Any]:
        return self._engine().finditer(text)

"""User-supplied regexes (``rule.format`` ``pattern``, ``extract_pattern``, ``judge.llm`` ``score_regex``):
never unbounded work outside a deadline.

A pattern may run on RE2 (the ``google-re2`` package: no backtracking) only when it is written in a
small allow-list of syntax that RE2 and Python's ``re`` read identically. The pattern is parsed with
``re``'s own parser and accepted only if every node is one of: literals, ``.`` (with ``re.DOTALL``),
sets of literals and ranges (no ``\\d \\w \\s`` classes: Unicode in ``re``, ASCII in RE2), alternation,
groups without inline flags, greedy or lazy repeats, ``^`` / ``\\A``. Refused: ``$`` and ``\\Z``, word
boundaries, inline flags (``(?i)``, ``(?m)``, ``(?x)``...), lookaround, backreferences, conditionals,
atomic groups and possessive repeats, a capturing group inside a repeat (``(a*)*`` captures differ),
a repeat of something that can match empty, a pattern that can match the empty string (``finditer``
differs), and, in the source text, ``{`` other than a complete ``{m}`` / ``{m,}`` / ``{m,n}`` (RE2 reads
``{,n}`` as text, ``re`` as a repeat) and ``[:`` ``[.`` ``[=`` (POSIX classes in RE2, sets in ``re``).
A refused pattern keeps ``re``; the refusal only costs a pool round trip, never a different answer.

RE2 is linear in the text but its per-character cost grows with the compiled program (wide counted
repeats make thousands of NFA states). So the inline path (in the scoring worker, no deadline) is
taken only for a program of at most ``MAX_INLINE_PROGRAM`` instructions on a text with
``len(text) × program size <= INLINE_BUDGET`` that UTF-8 can encode; anything else is matched in the
killable pool under the component deadline (on RE2 when eligible, else ``re``), where a timeout is
attributed by the canary rule (``reward_models.scoring``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

try:
    import re._parser as _sre  # Python >= 3.11
except ImportError:  # pragma: no cover - older Pythons
    import sre_parse as _sre  # type: ignore[no-redef]

MAX_INLINE_PROGRAM = 1000  # RE2 instructions
INLINE_BUDGET = 2_000_000  # len(text) × program size, matched inline without a deadline

_SOURCE_REFUSED = re.compile(r"\[[:.=]|\{(?!\d+(?:,\d*)?\})")
_FLAGS_OK = re.DOTALL | re.UNICODE
_SET_ITEMS = {_sre.LITERAL, _sre.RANGE, _sre.NEGATE}
_ANCHORS = {_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING}
_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT}


def _nodes_agree(nodes: Any, repeated: bool) -> bool:
    """Every node of a parsed (sub)pattern is on the allow-list; ``repeated``: inside a repeat."""
    for op, av in nodes:
        if op in (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY):
            continue
        if op is _sre.IN:
            if any(item_op not in _SET_ITEMS for item_op, _ in av):
                return False
        elif op is _sre.AT:
            if av not in _ANCHORS:
                return False
        elif op is _sre.BRANCH:
            if not all(_nodes_agree(branch, repeated) for branch in av[1]):
                return False
        elif op is _sre.SUBPATTERN:
            group, add_flags, del_flags, sub = av
            if add_flags or del_flags or (group is not None and repeated):
                return False
            if not _nodes_agree(sub, repeated):
                return False
        elif op in _REPEATS:
            low, high, sub = av
            many = high > 1
            if many and sub.getwidth()[0] == 0:
                return False
            if not _nodes_agree(sub, repeated or many):
                return False
        else:  # lookaround, backreferences, conditionals, atomic groups, possessive repeats, \b, $ ...
            return False
    return True


def same_in_re2(pattern: str, dotall: bool = True) -> bool:
    """True when ``pattern`` uses only syntax RE2 and ``re`` read identically."""
    if _SOURCE_REFUSED.search(pattern):
        return False
    try:
        parsed = _sre.parse(pattern, re.DOTALL if dotall else 0)
    except (re.error, OverflowError, RecursionError):
        return False
    if parsed.state.flags & ~_FLAGS_OK or parsed.getwidth()[0] == 0:
        return False
    try:
        return _nodes_agree(parsed, repeated=False)
    except RecursionError:
        return False


def _re2(pattern: str, dotall: bool) -> Any | None:
    """The RE2 program for ``pattern`` (with ``dotall``: dot matches newline, as ``re.DOTALL``), or None."""
    if not same_in_re2(pattern, dotall):
        return None
    try:
        import re2
    except ImportError:  # the pool still bounds the time
        return None
    try:
        return re2.compile(("(?s)" if dotall else "") + pattern)
    except Exception:  # noqa: BLE001 - re2 raises its own error type for unsupported syntax
        return None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: RE2 cannot take them
        return False
    return True


class UserPattern:
    """A validated user regex (``re.DOTALL`` unless ``dotall=False``); ValueError (naming the problem) if
    ``re`` rejects it."""

    def __init__(self, pattern: str, dotall: bool = True) -> None:
        try:
            self._re = re.compile(pattern, re.DOTALL if dotall else 0)
        except (re.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"invalid regex: {exc}") from None
        self.pattern = pattern
        self._linear = _re2(pattern, dotall)
        self.program_size = 0 if self._linear is None else int(self._linear.programsize)

    @property
    def linear(self) -> bool:
        """True when RE2 reads the pattern as ``re`` does (matching may run on RE2)."""
        return self._linear is not None

    @property
    def inline_pattern(self) -> bool:
        """True when some texts may be matched inline (RE2, a program of bounded size)."""
        return self._linear is not None and self.program_size <= MAX_INLINE_PROGRAM

    def inline_ok(self, text: str) -> bool:
        """May ``text`` be matched inline, without a deadline? (bounded RE2 work, see the module doc)"""
        return self.inline_pattern and len(text) * self.program_size <= INLINE_BUDGET and _encodable(text)

    @property
    def groups(self) -> int:
        return self._re.groups

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self._re.groupindex)

    def _engine(self, text: str) -> Any:
        return self._linear if self._linear is not None and _encodable(text) else self._re

    def search(self, text: str) -> Any:
        return self._engine(text).search(text)

    def fullmatch(self, text: str) -> Any:
        return self._engine(text).fullmatch(text)

    def finditer(self, text: str) -> Iterator[Any]:
        return self._engine(text).finditer(text)

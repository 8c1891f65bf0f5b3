"""Checks on the raw wire that hold for every request, before any route runs (docs/errors.md).

A JSON body must be an ``application/json`` document without duplicate keys whose strings PostgreSQL
can store (no NUL, no unpaired surrogate), whose numbers are finite and whose integers fit in a signed
64-bit integer, anywhere in the document (typed fields and free-form JSON alike). Path and query
parameters must not contain control characters. Each failure names the field as the user wrote it.

The common case costs one C-level parse: the slow walk that finds the offending field runs only when
a cheap byte scan or a parse hook saw something suspicious.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import parse_qsl

import orjson

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# objects/arrays nested deeper than this are refused (422, naming the field): the serialisers the
# body meets later (pydantic's, the JSON encoder of the JSONB columns) recurse and give up at a few
# hundred levels; the parsers accept ~1000 (beyond that: 400 "nested too deeply")
MAX_DEPTH = 64
JSON_MEDIA_TYPES = ("application/json",)
ARROW_MEDIA_TYPE = "application/vnd.apache.arrow.stream"  # a lease's answer, or an Arrow POST /v1/groups body
# an escape for NUL or for a surrogate (paired surrogates are legal; the walk tells them apart)
_ESCAPES = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")
# every key is a string followed by ':' (a string value holding '":' only over-counts, which is safe)
_KEY_SPELLING = re.compile(rb'"[ \t\r\n]*:')
_CONTAINERS = frozenset({dict, list})
_NUMBERS = frozenset({int, float, bool})
# numbers that may not fit: an integer part of 19+ digits, or an exponent of three digits. A fraction (the
# digits after a '.') never counts: any number of them is a finite double, and a log-prob near 0 is written with
# up to 20 (Python's repr of -0.00012345678901234567). Every digit maps to '0', 'E' to 'e', and each byte that
# may come right before a JSON number (a sign, '[', ',', ':', whitespace) to ','. Then an integer part of 19+
# digits is ',' + 19 '0's (or 19 '0's at the body's start), which a fraction's digits, after a '.', never are:
# one translate and two literal searches, C speed whatever the body holds (12 MB of token ids and log-probs ~40
# ms, an 8.8 MB body of 19-digit fractions ~35 ms, like orjson's parse; skipping fraction runs one by one in
# Python took 480 ms on that one, rewriting the fractions away first 170 ms on the 12 MB)
_DIGITS = bytes.maketrans(b"123456789E-[: \t\n\r", b"000000000e,,,,,,,")
_LONG_DIGITS = b"0" * 19
_LONG_INTEGER = b"," + _LONG_DIGITS
_BIG_EXPONENT = re.compile(rb"e[+,]?000")  # e-000 is e,000 once mapped
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BAD_TEXT = re.compile(r"[\x00\ud800-\udfff]")


class WireError(Exception):
    """A request rejected before routing: ``status`` 400 (malformed) / 415 / 422, and the field."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status, self.field, self.message = status, field, message


class _Duplicate:
    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


def _pairs_hook(flags: list[bool]):
    """``object_pairs_hook`` that marks a duplicated key in place (the walk reports its path)."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Duplicate:
        out = dict(pairs)
        if len(out) == len(pairs):
            return out
        flags.append(True)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                return _Duplicate(key)
            seen.add(key)
        return out

    return hook


class _NonFinite:
    """Where ``NaN`` / ``Infinity`` / ``-Infinity`` stood (Python's json accepts them; JSON does not)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _constant_hook(flags: list[bool]):
    def hook(name: str) -> _NonFinite:
        flags.append(True)
        return _NonFinite(name)

    return hook


def check_content_type(content_type: str | None, allowed: tuple[str, ...] = JSON_MEDIA_TYPES) -> str:
    """The body's media type (parameters such as charset dropped); 415 unless it is one of ``allowed``."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in allowed:
        got = f"{media!r}" if media else "none"
        raise WireError(415, "content-type", f"expected {' or '.join(allowed)}, got {got}")
    return media


def check_containers(body: bytes, limit: int | None) -> None:
    """413 when ``body`` may hold more JSON objects and arrays than ``limit`` (``max_body_containers``): an upper
    bound counted on the bytes (a brace inside a string counts too), so a body of millions of tiny containers
    is refused before it is parsed into millions of Python objects."""
    if limit is None or len(body) <= limit:
        return
    n = body.count(b"{") + body.count(b"[")
    if n > limit:
        raise WireError(413, "body", f"about {n}: more JSON objects and arrays than the limit of {limit} "
                                     "(max_body_containers); send fewer groups per request, or less structured metadata")


def parse_json_body(raw: bytes) -> Any:
    """Parse and check a JSON body; returns the parsed document. Raises WireError naming the field.

    Fast path: orjson parses, and when no byte pattern is suspicious and the body has no more
    ``"key":`` spellings than the parsed objects have keys, there is no duplicate and nothing to
    report. Anything else takes the exact path (the stdlib parser with hooks, and the walk).
    """
    try:
        doc = orjson.loads(raw)
    except (orjson.JSONDecodeError, RecursionError):
        return _parse_exactly(raw)
    if _suspicious(raw) or len(_KEY_SPELLING.findall(raw)) != _count_keys(doc):
        return _parse_exactly(raw)
    return doc


def _count_keys(doc: Any) -> int:
    """Keys of every object in ``doc``; lists of scalars are skipped at C speed (``map(type, ...)``).
    Raises WireError when a container lies deeper than MAX_DEPTH."""
    total, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is dict:
            total += len(node)
            children = [v for v in node.values() if type(v) in _CONTAINERS]
        elif type(node) is list and not _numbers_only(node):
            children = [v for v in node if type(v) in _CONTAINERS]
        else:
            continue
        if children and depth >= MAX_DEPTH:
            _check_depth(doc)
        stack.extend((v, depth + 1) for v in children)
    return total


def _numbers_only(values: list[Any]) -> bool:
    """True when ``values`` (parsed JSON) holds no object and no array. A list of numbers (a token array) is
    summed in C, ~5x faster than collecting its item types: ``sum`` refuses (TypeError) every item of parsed
    JSON that is not a number (a dict, a list, a string, None) and accepts every one that is."""
    if values and type(values[0]) in _NUMBERS and type(values[-1]) in _NUMBERS:
        try:
            sum(values)
        except (TypeError, OverflowError):
            pass
        else:
            return True
    # anything else (a list of strings, nulls, objects) in one pass: a sum that fails first would cost ~2x on
    # a body of millions of short lists (an attack measured it)
    return _CONTAINERS.isdisjoint(map(type, values))


def _check_depth(doc: Any) -> None:
    """WireError naming the first container nested deeper than MAX_DEPTH (the root is level 1)."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if type(node) not in _CONTAINERS:
            continue
        if depth > MAX_DEPTH:
            raise WireError(422, path or "body", f"nested more than {MAX_DEPTH} levels deep (objects and arrays)")
        items = node.items() if type(node) is dict else enumerate(node)
        for key, value in items:
            sub = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
            stack.append((value, sub, depth + 1))


def _parse_exactly(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(400, "body", f"not UTF-8 (byte {exc.start})") from None
    flags: list[bool] = []
    try:
        doc = json.loads(text, object_pairs_hook=_pairs_hook(flags), parse_constant=_constant_hook(flags))
    except json.JSONDecodeError as exc:
        raise WireError(400, "body", f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise WireError(400, "body", "nested too deeply") from None
    except ValueError:  # an integer literal longer than Python's int parsing limit
        raise WireError(422, "body", "integer out of range; integers must lie in [-2^63, 2^63 - 1]") from None
    _check_depth(doc)
    if flags or _suspicious(raw):
        problem = find_problem(doc)
        if problem is not None:
            raise WireError(400 if problem[1].startswith("duplicate key") else 422, *problem)
    return doc


def _suspicious(raw: bytes) -> bool:
    """A cheap over-approximation: False means no value can fail ``find_problem`` (besides flags)."""
    if b"\\u" in raw and _ESCAPES.search(raw):  # a literal search first: most bodies hold no escape at all
        return True
    digits = raw.translate(_DIGITS)
    if _BIG_EXPONENT.search(digits) is not None:
        return True
    return digits.startswith(_LONG_DIGITS) or _LONG_INTEGER in digits


def find_problem(doc: Any, path: str = "") -> tuple[str, str] | None:
    """(field, message) of the first value PostgreSQL or the JSON encoder cannot take, else None."""
    where = path or "body"
    if isinstance(doc, _Duplicate):
        return f"{path}.{doc.key}" if path else doc.key, "duplicate key in one JSON object"
    if isinstance(doc, _NonFinite):
        return where, f"{doc.name} is not JSON; numbers must be finite"
    if isinstance(doc, str):
        text = _text_problem(doc) if _BAD_TEXT.search(doc) else None
        return (where, text) if text else None
    if isinstance(doc, bool) or doc is None:
        return None
    if isinstance(doc, int):
        if not INT64_MIN <= doc <= INT64_MAX:
            return where, f"integer out of range; integers must lie in [-2^63, 2^63 - 1], got {len(str(doc))} digits"
        return None
    if isinstance(doc, float):
        return None if math.isfinite(doc) else (where, "number too large; numbers must be finite doubles")
    items = doc.items() if isinstance(doc, dict) else enumerate(doc)
    for key, value in items:
        if isinstance(key, str):
            text = _text_problem(key) if _BAD_TEXT.search(key) else None
            if text:
                return f"{path}.{key!r}" if path else repr(key), f"key: {text}"
        sub = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        found = find_problem(value, sub)
        if found is not None:
            return found
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which text fields cannot hold"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode text"
    return None


def check_params(path: str, query_string: bytes) -> None:
    """422 when the (decoded) path or a query parameter holds a control character."""
    if _CONTROL.search(path):
        raise WireError(422, "path", "contains a control character (U+0000-U+001F, U+007F-U+009F)")
    if not query_string:
        return
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise WireError(400, "query", "not UTF-8 after percent-decoding") from None
    for name, value in pairs:
        if _CONTROL.search(name) or _CONTROL.search(value):
            raise WireError(
                422, f"query.{name!r}" if _CONTROL.search(name) else f"query.{name}",
                "contains a control character (U+0000-U+001F, U+007F-U+009F)",
            )

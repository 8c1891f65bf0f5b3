"""Plain data across the sandbox boundary: tagged JSON, never pickle.

Values are built-in literals only: None, bool, int, float, complex, str, bytes, list, tuple, dict,
set, frozenset, checked by exact type (a subclass of ``int`` with a rigged ``__eq__`` is refused).
JSON scalars stand for themselves; every container is a one-key object naming its type:
``{"l": [...]}`` list, ``{"t": [...]}`` tuple, ``{"s": [...]}`` set, ``{"f": [...]}`` frozenset,
``{"d": [[k, v], ...]}`` dict, ``{"b": "<hex>"}`` bytes, ``{"c": [re, im]}`` complex and
``{"i": "<hex>"}`` an int outside +-2**64 (JSON numbers go through decimal text, which Python caps
at 4300 digits and converts in quadratic time; hex is linear both ways).

Decoding (``from_plain``) rebuilds fresh built-ins, so what comes out of the sandbox cannot carry
code. It is bounded: nesting at ``MAX_DEPTH``, hashed entries (set members and dict keys) at
``MAX_HASHED`` per *message* (not per container), and, given a ``deadline`` (``time.monotonic()``
value), it checks the clock every ``_CHECK_EVERY`` elements and raises ``DecodeTimeout`` past it:
crafted hash collisions make each insertion cost O(n), so the cap alone still allowed seconds of
quadratic work in the trusted harness. This module uses only the standard library: its source is
also run inside the sandbox.
"""

import json
import time

MAX_DEPTH = 64
MAX_HASHED = 20_000
_BIG_INT = 1 << 64
_CHECK_EVERY = 64
_SCALARS = (type(None), bool, float, str)
_SEQUENCES = {list: "l", tuple: "t", set: "s", frozenset: "f"}


class PlainDataError(ValueError):
    """A value that is not plain data (or nests deeper than MAX_DEPTH)."""


class TooDeep(PlainDataError):
    """A value nested deeper than MAX_DEPTH."""


class DecodeTimeout(PlainDataError):
    """Decoding ran past its deadline (e.g. crafted hash collisions)."""


def to_plain(value, depth=0):
    """``value`` as JSON-able tagged data; PlainDataError when it is not plain data."""
    if depth > MAX_DEPTH:
        raise TooDeep(f"nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is int:
        return value if -_BIG_INT < value < _BIG_INT else {"i": format(value, "x")}
    if kind in _SEQUENCES:
        return {_SEQUENCES[kind]: [to_plain(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise PlainDataError(f"{kind.__name__} is not plain data")


class _Decoder:
    """One message's decoding budget: hashed entries left, elements since the last clock check."""

    def __init__(self, deadline):
        self.deadline, self.hashed, self.ticks = deadline, 0, 0

    def tick(self, hashed=False):
        if hashed:
            self.hashed += 1
            if self.hashed > MAX_HASHED:
                raise PlainDataError(f"more than {MAX_HASHED} set or dict entries in one message")
        self.ticks += 1
        if self.deadline is not None and self.ticks % _CHECK_EVERY == 0 and time.monotonic() > self.deadline:
            raise DecodeTimeout("decoding ran past the deadline")

    def value(self, data, depth):
        if depth > MAX_DEPTH:
            raise TooDeep(f"nested deeper than {MAX_DEPTH}")
        kind = type(data)
        if kind in _SCALARS or kind is int:
            return data
        if kind is not dict or len(data) != 1:
            raise PlainDataError(f"malformed plain data: {kind.__name__}")
        ((tag, body),) = data.items()
        try:
            return self._tagged(tag, body, depth)
        except (TypeError, ValueError) as exc:  # an unhashable set member or dict key, bad hex
            if isinstance(exc, PlainDataError):
                raise
            raise PlainDataError(f"malformed plain data: {exc}") from None

    def _items(self, body, depth, hashed):
        for item in body:
            self.tick(hashed)
            yield self.value(item, depth + 1)

    def _tagged(self, tag, body, depth):
        if type(body) is list:
            if tag == "l":
                return list(self._items(body, depth, False))
            if tag == "t":
                return tuple(self._items(body, depth, False))
            if tag in ("s", "f"):
                built = set()
                for item in self._items(body, depth, True):
                    built.add(item)  # one at a time: the clock is checked between insertions
                return built if tag == "s" else frozenset(built)
            if tag == "d":
                return self._dict(body, depth)
            if tag == "c" and len(body) == 2:
                return complex(float(body[0]), float(body[1]))
        if type(body) is str and tag == "b":
            return bytes.fromhex(body)
        if type(body) is str and tag == "i" and _is_hex(body):
            return int(body, 16)
        raise PlainDataError(f"malformed plain data: tag {tag!r}")

    def _dict(self, body, depth):
        built = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise PlainDataError("malformed plain data: dict entry")
            self.tick(True)
            built[self.value(pair[0], depth + 1)] = self.value(pair[1], depth + 1)
        return built


def _is_hex(text):
    """``-?[0-9a-f]+`` exactly (``int(_, 16)`` would also take "0x", "_", spaces)."""
    digits = text[1:] if text.startswith("-") else text
    return bool(digits) and not digits.strip("0123456789abcdef")


def from_plain(data, deadline=None):
    """Rebuild a value from ``to_plain`` output; PlainDataError for anything malformed or too big,
    DecodeTimeout once ``time.monotonic()`` passes ``deadline``."""
    return _Decoder(deadline).value(data, 0)


def dumps(value):
    """``value`` as compact JSON bytes."""
    return json.dumps(to_plain(value), separators=(",", ":")).encode()


def loads(raw, deadline=None):
    """The value encoded in ``raw`` (bytes); PlainDataError for anything else."""
    try:
        return from_plain(json.loads(raw), deadline)
    except (RecursionError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, PlainDataError):
            raise
        raise PlainDataError(f"malformed plain data: {type(exc).__name__}") from None

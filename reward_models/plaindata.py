"""Plain data across the sandbox boundary: tagged JSON, never pickle.

Values are built-in literals only: None, bool, int, float, complex, str, bytes, list, tuple, dict,
set, frozenset, checked by exact type (a subclass of ``int`` with a rigged ``__eq__`` is refused).
JSON scalars stand for themselves; every container is a one-key object naming its type:
``{"l": [...]}`` list, ``{"t": [...]}`` tuple, ``{"s": [...]}`` set, ``{"f": [...]}`` frozenset,
``{"d": [[k, v], ...]}`` dict, ``{"b": "<hex>"}`` bytes, ``{"c": [re, im]}`` complex. Nesting is
capped at ``MAX_DEPTH`` and sets / dicts at ``MAX_HASHED`` entries (crafted hash collisions cost
quadratic time to rebuild); decoding rebuilds fresh built-ins, so what comes out of the sandbox cannot
carry code. This module uses only the standard library: its source is also run inside the sandbox.
"""

import json

MAX_DEPTH = 64
MAX_HASHED = 20_000
_HASHED = ("s", "f", "d")
_SCALARS = (type(None), bool, int, float, str)
_SEQUENCES = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_BUILDERS = {"l": list, "t": tuple, "s": set, "f": frozenset}


class PlainDataError(ValueError):
    """A value that is not plain data (or nests deeper than MAX_DEPTH)."""


def to_plain(value, depth=0):
    """``value`` as JSON-able tagged data; PlainDataError when it is not plain data."""
    if depth > MAX_DEPTH:
        raise PlainDataError(f"nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind in _SEQUENCES:
        return {_SEQUENCES[kind]: [to_plain(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[to_plain(k, depth + 1), to_plain(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    raise PlainDataError(f"{kind.__name__} is not plain data")


def from_plain(data, depth=0):
    """Rebuild a value from ``to_plain`` output; PlainDataError for anything malformed."""
    if depth > MAX_DEPTH:
        raise PlainDataError(f"nested deeper than {MAX_DEPTH}")
    kind = type(data)
    if kind in _SCALARS:
        return data
    if kind is not dict or len(data) != 1:
        raise PlainDataError(f"malformed plain data: {kind.__name__}")
    ((tag, body),) = data.items()
    if tag in _HASHED and type(body) is list and len(body) > MAX_HASHED:
        raise PlainDataError(f"more than {MAX_HASHED} entries in a set or dict")  # bounds hash-collision work
    try:
        if tag in _BUILDERS and type(body) is list:
            return _BUILDERS[tag](from_plain(v, depth + 1) for v in body)
        if tag == "d" and type(body) is list:
            return {from_plain(k, depth + 1): from_plain(v, depth + 1) for k, v in _pairs(body)}
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2:
            return complex(float(body[0]), float(body[1]))
    except (TypeError, ValueError) as exc:  # an unhashable set member or dict key, bad hex
        raise PlainDataError(f"malformed plain data: {exc}") from None
    raise PlainDataError(f"malformed plain data: tag {tag!r}")


def _pairs(body):
    for pair in body:
        if type(pair) is not list or len(pair) != 2:
            raise PlainDataError("malformed plain data: dict entry")
        yield pair


def dumps(value):
    """``value`` as compact JSON bytes."""
    return json.dumps(to_plain(value), separators=(",", ":")).encode()


def loads(raw):
    """The value encoded in ``raw`` (bytes); PlainDataError for anything else."""
    try:
        return from_plain(json.loads(raw))
    except (RecursionError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, PlainDataError):
            raise
        raise PlainDataError(f"malformed plain data: {type(exc).__name__}") from None

"""The plain-data codec between the sandboxes and the supervisor: ints of any size, malformed values,
hash-collision and decode-time bounds. Each case reproduces an attack of the second round on verifier.code.
"""

from __future__ import annotations

import time

import pytest

from reward_models.plaindata import (
    MAX_HASHED,
    DecodeTimeout,
    PlainDataError,
    dumps,
    from_plain,
    loads,
    to_plain,
)


# Attack (verifier.code, round 2) broke this: ints of any size round trip
@pytest.mark.parametrize(
    "value",
    [2**64 - 1, 2**64, -(2**64) + 1, -(2**64), 3**10000, -(7**9000), [{2**70: (2**90,)}]],
    ids=lambda v: f"bits{v.bit_length()}" if type(v) is int else "nested",
)
# Attack (verifier.code, round 2) broke this: ints of any size round trip
def test_ints_of_any_size_round_trip(value: object) -> None:
    encoded = to_plain(value)
    assert loads(dumps(value)) == value
    if type(value) is int and abs(value) >= 2**64:
        assert set(encoded) == {"i"}  # hex, never a decimal JSON number


# Attack (verifier.code, round 2) broke this: malformed big ints are refused
@pytest.mark.parametrize("body", ["", "-", "1_0", " 1f", "0x1f", "zz", 12])
# Attack (verifier.code, round 2) broke this: malformed big ints are refused
def test_malformed_big_ints_are_refused(body: object) -> None:
    with pytest.raises(PlainDataError):
        from_plain({"i": body})


# Attack (verifier.code, round 2) broke this: hashed entries are capped per message not per container
def test_hashed_entries_are_capped_per_message_not_per_container() -> None:
    half = {"s": list(range(MAX_HASHED // 2 + 1))}
    assert len(from_plain(half)) == MAX_HASHED // 2 + 1
    with pytest.raises(PlainDataError, match="one message"):
        from_plain({"l": [half, half]})


# Attack (verifier.code, round 2) broke this: decoding stops at the deadline
def test_decoding_stops_at_the_deadline() -> None:
    colliding = {"s": [(2**61 - 1) * k for k in range(1, 5001)]}
    with pytest.raises(DecodeTimeout):
        from_plain(colliding, deadline=time.monotonic() - 1.0)
    with pytest.raises(DecodeTimeout):
        from_plain({"l": list(range(1000))}, deadline=time.monotonic() - 1.0)
    assert len(from_plain(colliding, deadline=time.monotonic() + 60.0)) == 5000

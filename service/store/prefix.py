"""A group's shared prompt tokens, stored once (migration 0016; bench/prompt_dedup.py measures it).

Every member of a group begins with the group's prompt, so its token ids, loss mask, log-probs and versions
repeat the same leading bytes G times. ``split`` finds the longest prefix that all members share byte for
byte in every array they carry -- never assuming what a prompt's log-probs are, so putting the two back
together (``prefix || suffix``, in SQL: ``service.store.models.Trajectory.token_ids``) gives exactly the bytes
posted -- and cuts it off each member. It declines (None) unless the saving is worth a row:

- fewer than two members, or a shared prefix under ``MIN_TOKENS`` tokens;
- a segmented member (its arrays are several sequences end to end; kept whole);
- an array some members carry and others do not (None in one, bytes in another).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.store import arrays

# the stored arrays, in order, with their element types
ARRAYS = (("token_ids", arrays.TOKEN_DTYPE), ("loss_mask", arrays.MASK_DTYPE), ("logprobs", arrays.LOGPROB_DTYPE),
          ("versions", arrays.VERSION_DTYPE))
MIN_TOKENS = 16  # a shorter prefix saves less than its own row costs


@dataclass(frozen=True)
class Split:
    n_tokens: int  # the shared prefix's length in tokens
    prefix: dict[str, bytes | None]  # its bytes per array (None: no member carries that array)
    suffixes: list[dict[str, bytes | None]]  # each member's bytes after it, per array, in member order


def _common_bytes(values: list[bytes]) -> int:
    """The length in bytes of the longest prefix every one of ``values`` starts with."""
    first = np.frombuffer(values[0], dtype=np.uint8)
    n = first.size
    for v in values[1:]:
        other = np.frombuffer(v, dtype=np.uint8)
        m = min(n, other.size)
        differ = np.flatnonzero(first[:m] != other[:m])
        n = int(differ[0]) if differ.size else m
        if n == 0:
            break
    return n


def split(members: list[dict[str, bytes | None]], segmented: bool = False) -> Split | None:
    """members: each member's stored arrays by name (``ARRAYS``) -> the shared prefix and each member's rest,
    or None when the group is stored whole (see the module docstring)."""
    if len(members) < 2 or segmented or any(m["token_ids"] is None for m in members):
        return None
    n_tokens = None
    for name, dtype in ARRAYS:
        values = [m[name] for m in members]
        if all(v is None for v in values):
            continue
        if any(v is None for v in values):
            return None
        k = _common_bytes([v for v in values if v is not None]) // dtype.itemsize
        n_tokens = k if n_tokens is None else min(n_tokens, k)
    if n_tokens is None or n_tokens < MIN_TOKENS:
        return None
    cut = {name: n_tokens * dtype.itemsize for name, dtype in ARRAYS}
    return Split(n_tokens, {name: _slice(members[0][name], 0, cut[name]) for name, _ in ARRAYS},
                 [{name: _slice(m[name], cut[name], None) for name, _ in ARRAYS} for m in members])


def _slice(raw: bytes | None, start: int, end: int | None) -> bytes | None:
    return None if raw is None else bytes(raw[start:end])

"""Token ids, loss masks and log-probs are stored as raw little-endian ``bytea``.

Measured on this project's 2-core machine (``bench/array_storage.py``): PostgreSQL ``int4[]``/``float4[]``
arrays are several times slower to COPY in and to read back than raw bytes, so rows keep
``int32`` token ids, ``uint8`` loss masks and ``float32`` log-probs as bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TOKEN_DTYPE = np.dtype("<i4")
MASK_DTYPE = np.dtype("u1")
LOGPROB_DTYPE = np.dtype("<f4")


def encode(values: Sequence[float] | Sequence[int] | None, dtype: np.dtype) -> bytes | None:
    """list (T,) -> T * itemsize bytes, or None."""
    if values is None:
        return None
    return np.asarray(values, dtype=dtype).tobytes()


def decode(raw: bytes | memoryview | None, dtype: np.dtype) -> np.ndarray | None:
    """bytes -> array (T,); None stays None."""
    if raw is None:
        return None
    return np.frombuffer(raw, dtype=dtype)


def decode_list(raw: bytes | memoryview | None, dtype: np.dtype) -> list | None:
    arr = decode(raw, dtype)
    return None if arr is None else arr.tolist()

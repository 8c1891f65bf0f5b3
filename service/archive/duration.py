"""Archive durations (``--older-than``, ``GRPO_CURATOR_RETENTION``): ``0s``, ``90m``, ``12h``, ``7d``, ``2w``.

Free of the rest of the service so that settings can validate a retention when they load."""

from __future__ import annotations

import re
from datetime import timedelta

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$"
# ours: longer than any retention, far inside what ``now - older_than`` can hold (datetime's year 1)
MAX_DAYS = 36_500
_DURATION = re.compile(PATTERN)


def parse_duration(text: str, where: str = "--older-than") -> timedelta:
    """``0s``, ``90m``, ``12h``, ``7d``, ``2w`` -> timedelta, at most ``MAX_DAYS``; a ValueError naming ``where``
    otherwise."""
    m = _DURATION.match(text or "")
    if m is None:
        raise ValueError(f"{where} {text!r}: expected a number and a unit (s, m, h, d, w), e.g. 7d or 0s")
    seconds = float(m.group(1)) * UNITS[m.group(2)]
    if not seconds <= MAX_DAYS * 86400:  # also inf, from a number too long for a float
        raise ValueError(f"{where} {text!r}: at most {MAX_DAYS}d (100 years)")
    return timedelta(seconds=seconds)

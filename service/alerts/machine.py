"""The alert state machine: ok -> warning -> critical -> resolved, with hysteresis and a cooldown.

Pure: the service feeds it the current state and a monitor's result and stores what it answers.
- ok opens an alert in the result's state (warning or critical), unless the monitor is cooling down
  (fewer than ``cooldown_versions`` versions since its last alert in that scope was resolved);
- warning goes to critical when the value reaches critical (a critical alert stays critical: the breaker
  does not flicker while the value hovers around the line);
- an open alert resolves itself (``auto_resolve``) once the value is below ``warning * resolve_ratio``
  (hysteresis); an admin may resolve it at any time. No data (value None) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    resolve_ratio: float = 0.8
    cooldown_versions: int = 5
    auto_resolve: bool = True


def cooling(last_resolved: int | None, version: int, policy: Policy) -> bool:
    return last_resolved is not None and version < last_resolved + policy.cooldown_versions


def step(current: str, result_state: str, value: float | None, warning: float, policy: Policy,
         cooling_down: bool = False) -> str | None:
    """The next state, or None when it stays. ``current``: ok | warning | critical."""
    if current == "ok":
        return None if result_state == "ok" or cooling_down else result_state
    if value is None:
        return None
    if policy.auto_resolve and value < warning * policy.resolve_ratio:
        return "resolved"
    if current == "warning" and result_state == "critical":
        return "critical"
    return None

"""The open training-health alerts as text lines, under ``grpo-curator stats``'s table (docs/alerts.md)."""

from __future__ import annotations

from typing import Any


def open_alerts(client: Any) -> list[dict[str, Any]]:
    """Open alerts (critical first); [] when the service has no alerts route or the key may not read it."""
    from service.client import CuratorError

    try:
        alerts = client._json("GET", "/v1/alerts")["alerts"]
    except (CuratorError, KeyError, TypeError):
        return []
    return sorted((a for a in alerts if a.get("state") in ("warning", "critical")), key=lambda a: a["state"] != "critical")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_alerts(alerts: list[dict[str, Any]]) -> str:
    if not alerts:
        return "alerts: none open (every monitor is ok)"
    lines = [f"alerts: {len(alerts)} open"]
    for a in alerts:
        scope = a["dataset"] if a["dataset"] is not None else "overall"
        lines.append(f"  {a['state'].upper():8} {a['monitor']} ({scope}) value {_num(a['value'])} >= "
                     f"{_num(a['threshold'])} since {a['since']}  [{a['id']}]")
    return "\n".join(lines)

"""docs/alerts.md states every monitor's defaults and every alert setting as the code has them."""

from __future__ import annotations

import re
from pathlib import Path

from filters.monitors import MONITORS
from service.settings import Settings

DOC = (Path(__file__).resolve().parents[3] / "docs" / "alerts.md").read_text()


def test_every_monitor_and_its_defaults_are_documented():
    for name, spec in MONITORS.items():
        assert f"| `{name}` | {spec.kind} | `{spec.series}` | {spec.warning:g} | {spec.critical:g} | {spec.source} |" in DOC


def test_every_documented_setting_exists_with_its_default():
    rows = re.findall(r"\| `GRPO_CURATOR_(ALERT_[A-Z_]+)` \| ([^|]+) \|", DOC)
    fields = Settings.model_fields
    assert {f"alert_{r[0][6:].lower()}" for r in rows} == {f for f in fields if f.startswith("alert_")}
    for env, default in rows:
        value = fields[env.lower()].default
        assert default.strip() == ("none" if value is None else str(value).lower() if isinstance(value, bool) else f"{value:g}")

"""docker-compose.yml: PostgreSQL (healthcheck) -> migrate -> API -> worker, commands the CLI knows."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from service.cli.main import LATER, build_parser
from tests.conftest import ROOT

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml").read_text())


def test_startup_order():
    s = COMPOSE["services"]
    assert "healthcheck" in s["postgres"]
    assert s["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert s["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert s["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert s["trainer"]["profiles"] == ["train"]


def test_commands_are_real_cli_commands():
    for name, service in COMPOSE["services"].items():
        cmd = service.get("command")
        if not cmd:
            continue
        argv = cmd if isinstance(cmd, list) else shlex.split(cmd)
        assert argv[0] == "grpo-curator", name
        if argv[1] in LATER:
            continue  # parsed by the subcommand's own module
        build_parser().parse_args(argv[1:])  # raises SystemExit on an unknown option


def test_worker_can_start_bubblewrap_sandboxes_as_a_non_root_user():
    worker = COMPOSE["services"]["worker"]
    assert set(worker["security_opt"]) == {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}
    assert worker["environment"]["GRPO_CURATOR_SANDBOX_BACKEND"] == "bubblewrap"  # never a silent "none"
    assert "cap_add" not in worker and not worker.get("privileged", False)
    dockerfile = (Path(__file__).resolve().parents[1] / "Dockerfile").read_text()
    assert "bubblewrap" in dockerfile and "\nUSER curator\n" in dockerfile


# Attack: the Grafana 'consumed per minute' panel plotted the ready queue's net change, not consumption.
def test_grafana_consumption_panel_measures_consumption():
    """deploy/grafana: the panel "Ready groups consumed per minute" is -60 * deriv(ready queue depth) --
    the net change of the ready queue, not consumption: with producers keeping the queue level it reads 0
    while the trainer consumes hundreds of groups a minute (and it goes negative when producers run
    ahead). Consumption is the growth of grpo_curator_groups{status="consumed"}."""
    import json

    board = json.loads((ROOT / "deploy" / "grafana" / "grpo-curator.json").read_text())
    panels = [p for p in board["panels"] if "consum" in p.get("title", "").lower()]
    assert panels, "no consumption panel"
    for panel in panels:
        exprs = " ".join(t["expr"] for t in panel["targets"])
        assert 'status="consumed"' in exprs, f"{panel['title']}: {exprs}"

"""docker-compose.yml: PostgreSQL (healthcheck) -> migrate -> API -> worker, commands the CLI knows."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from service.cli.main import LATER, build_parser

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

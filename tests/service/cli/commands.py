"""The client commands of the CLI tests: each command that talks to a server, and a run of the real CLI in a
subprocess with no ``GRPO_CURATOR_*`` setting inherited from the test's environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT

COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "import": lambda f: ["import", "prompts", str(f), "--format", "jsonl"],
    "export": lambda f: ["export", "--format", "sft", "--out", str(f.with_name("out.jsonl"))],
    "stats": lambda f: ["stats"],
}


def run_cli(args: list[str], **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_CURATOR_")}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env={**base, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)

"""The client commands of the CLI tests: each command that talks to a server, and a run of the real CLI in a
process of its own with no ``GRPO_CURATOR_*`` setting inherited from the test's environment: ``run_cli`` starts
``python -m service.cli``; ``Forked.run`` forks the same command from a zygote that imported the CLI once
(tests/forked_cli.py), for modules that run dozens of such commands (~0.45 s of CPU each for Python's start-up
and the CLI's imports, before the command's first line)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT
from tests.forked_cli import Zygote

COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "import": lambda f: ["import", "prompts", str(f), "--format", "jsonl"],
    "export": lambda f: ["export", "--format", "sft", "--out", str(f.with_name("out.jsonl"))],
    "stats": lambda f: ["stats"],
}


def _env(env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_CURATOR_")}
    return {**base, **env}


def run_cli(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=_env(env), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


class Forked:
    """``run(args, **env)``: as ``run_cli``, in a command process forked from one zygote (its own process,
    environment, stdout, stderr and exit status: what ``python -m service.cli ARGS`` does after its imports)."""

    def __init__(self, zygote: Zygote) -> None:
        self.zygote = zygote

    def run(self, args: list[str], **env: str) -> subprocess.CompletedProcess:
        return self.run_env(args, _env(env))

    def run_env(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        """With exactly the environment ``env``."""
        proc = self.zygote.spawn(args, env)
        out: dict[str, str] = {}
        readers = [threading.Thread(target=lambda name=name: out.__setitem__(name, getattr(proc, name).read()))
                   for name in ("stdout", "stderr")]
        for reader in readers:
            reader.start()
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()  # the test fails here
            proc.wait()
            raise
        finally:
            for reader in readers:
                reader.join()
            proc.stdout.close()
            proc.stderr.close()
        return subprocess.CompletedProcess(["service.cli", *args], code, out["stdout"], out["stderr"])

"""Sandbox deployment settings: one typed object, environment prefix ``GRPO_CURATOR_SANDBOX_``.

Everything that weakens the sandbox lives here, set by whoever runs the workers, never in a reward
spec (a spec that asks for one of ``DEPLOYMENT_ONLY`` is rejected naming the param).

- ``backend``: ``auto`` (bubblewrap when it works, else refuse to score), ``bubblewrap`` (the same,
  but never anything else), ``none`` (**unsafe**: no namespaces at all; the program can read the
  worker's files and environment, reach the network and the database and signal the worker. Only
  for a throwaway machine that runs nothing else.)
- ``allow_network``: share the host's network namespace with the program.
- ``allow_subprocess``: let the program start up to ``max_processes`` processes / threads.
- ``bwrap``: the bubblewrap executable; ``tmpfs_mb``: size of the sandbox's private ``/tmp``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Backend = Literal["auto", "bubblewrap", "none"]
DEPLOYMENT_ONLY = frozenset(
    {"allow_network", "allow_subprocess", "backend", "isolation", "sandbox", "unsafe", "bwrap", "tmpfs_mb"}
)


class SandboxSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GRPO_CURATOR_SANDBOX_", extra="ignore", frozen=True)

    backend: Backend = "auto"
    allow_network: bool = False
    allow_subprocess: bool = False
    bwrap: str = "bwrap"
    tmpfs_mb: int = Field(default=256, ge=16)


@lru_cache(maxsize=1)
def get_sandbox_settings() -> SandboxSettings:
    """The settings from the environment, read once per process."""
    return SandboxSettings()

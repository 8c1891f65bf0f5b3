"""One typed settings object, built once from the environment (prefix ``GRPO_CURATOR_``).

``DATABASE_URL`` (no prefix) selects an external PostgreSQL; when it is unset the service starts an
embedded PostgreSQL (the ``pgserver`` package) in ``data_dir``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GRPO_CURATOR_", extra="ignore")

    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")
    )
    data_dir: Path = Path(".grpo-curator")
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    max_body_bytes: int = 64 * 1024 * 1024
    max_group_size: int = 1024
    max_groups_per_request: int = 256
    max_sequence_tokens: int = 262_144
    db_pool_size: int = 10
    db_max_overflow: int = 20
    # the in-process score / curate worker started by `serve` (the embedded default needs no other process)
    embedded_worker: bool = True
    worker_processes: int = 1
    worker_batch_groups: int = 32
    worker_poll_seconds: float = 0.5
    component_timeout_s: float = 10.0
    component_memory_mb: int = 1024
    # scoring retries (service.workers.pipeline): attempts per group, exponential backoff with jitter
    # (base * 2**(n-1), capped), and how long a worker's claim on a group holds before others may take it
    max_score_attempts: int = 10
    score_backoff_base_s: float = 1.0
    score_backoff_max_s: float = 300.0
    score_claim_seconds: float = 600.0
    lease_seconds_default: float = 300.0
    log_level: str = "info"

    @property
    def embedded_dir(self) -> Path:
        return self.data_dir / "pgdata"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()

"""One typed settings object, built once from the environment (prefix ``GRPO_CURATOR_``).

``DATABASE_URL`` (no prefix) selects an external PostgreSQL; when it is unset the service starts an
embedded PostgreSQL (the ``pgserver`` package) in ``data_dir``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AliasChoices, Field, PlainValidator, TypeAdapter, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.archive.duration import parse_duration

if TYPE_CHECKING:
    from reward_models.llm_judge import JudgeEndpoint

# log levels every consumer knows (Python's logging and uvicorn); aliases map to them, anything else is refused
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_LEVEL_ALIASES = {"warn": "warning", "fatal": "critical"}
MIN_BEAT_S = 0.05  # the shortest interval between two heartbeats of a score claim (service.worker.pipeline)


@lru_cache(maxsize=1)
def _judge_endpoints_adapter() -> TypeAdapter[dict[str, JudgeEndpoint]]:
    from reward_models.llm_judge import JudgeEndpoint  # httpx with it: only when endpoints are configured

    return TypeAdapter(dict[str, JudgeEndpoint])


def _judge_endpoints(value: Any) -> dict[str, JudgeEndpoint]:
    """``GRPO_CURATOR_JUDGE_ENDPOINTS`` as ``dict[str, JudgeEndpoint]`` (the same checks and errors), with
    ``reward_models.llm_judge`` imported only when there is something to check: every command reads the
    settings, few use a judge."""
    if isinstance(value, dict) and not value:
        return {}
    return _judge_endpoints_adapter().validate_python(value)


if TYPE_CHECKING:
    JudgeEndpoints = dict[str, JudgeEndpoint]
else:
    JudgeEndpoints = Annotated[dict[str, Any], PlainValidator(_judge_endpoints)]


def normalize_log_level(value: str) -> str:
    """``value`` as one of ``LOG_LEVELS`` (case-insensitive; ``warn`` / ``fatal`` accepted); ValueError else."""
    level = str(value).strip().lower()
    level = LOG_LEVEL_ALIASES.get(level, level)
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {value!r}: expected one of {', '.join(LOG_LEVELS)}")
    return level


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
    # scoring retries (service.worker.pipeline): attempts per group, exponential backoff with jitter
    # (base * 2**(n-1), capped), and how long a worker's claim on a group holds before others may take it
    max_score_attempts: int = 10
    score_backoff_base_s: float = 1.0
    score_backoff_max_s: float = 300.0
    score_claim_seconds: float = 30.0  # renewed every third of it while scored: a dead worker's groups return in <= 30 s
    # a group whose score worker died while it was claimed alone more than this many times is the likely
    # killer -> reward_error (every death gives the attempt back: a worker's death is not a scoring failure)
    max_solo_deaths: int = Field(default=3, ge=0)
    lease_seconds_default: float = 300.0
    # long polls: waiters per API process (beyond it: 429 + Retry-After), and the periodic re-check
    lease_max_waiters: int = Field(default=1024, ge=0)
    lease_retry_after_s: float = Field(default=1.0, gt=0)
    lease_wait_check_s: float = Field(default=2.0, gt=0)
    lease_attempt_slots: int | None = Field(default=None, ge=1)  # lease queries at once; None: db_pool_size // 2
    log_level: str = "info"
    # integrations (docs/integrations.md)
    max_score_items: int = Field(default=512, ge=1)  # items per POST /v1/score (413 beyond)
    # one scoring request's share of the shared process pool: wall time (413 beyond) and tasks at a time
    # (None: 2 per pool process), so no request can starve the worker or other callers
    score_pool_budget_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    score_pool_max_in_flight: int | None = Field(default=None, ge=1)
    # reward specs (by name) whose verifier.code components accept references (tests, prompt, io) from
    # callers other than admin keys; every other code spec runs only admin-loaded references (docs/security.md)
    caller_reference_specs: list[str] = Field(default_factory=list)
    # scoring requests (POST /v1/score, OpenRLHF) scored at once; more wait their turn without a thread
    score_concurrency: int = Field(default=32, ge=1)
    openrlhf_eos_means_stop: bool = True  # an OpenRLHF query without an end-of-sequence token is truncated
    openrlhf_on_error: Literal["fail", "value"] = "fail"  # an unscorable item: 503, or this value + a log flag
    openrlhf_error_value: float = Field(default=0.0, allow_inf_nan=False)
    # OpenRLHF's extra_logs: "lists" (0.11 reads JSON lists) or "omit" (0.8 torch.cat()s them: lists break it)
    openrlhf_extra_logs: Literal["lists", "omit"] = "lists"
    # python.function allowlist, name -> "/path/file.py[:function]"; reward_models.external reads the same
    # variable (GRPO_CURATOR_PYTHON_FUNCTIONS, JSON) in every worker process
    python_functions: dict[str, str] = Field(default_factory=dict)
    export_batch_rows: int = 1000
    # serve: open connections (long polls, stuck exports) get this long after SIGTERM, then are closed
    shutdown_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    # serve: an idle keep-alive connection is closed after this long. Longer than the clients' own idle expiry
    # (httpx and the openai SDK: 5 s), so a client drops an idle connection before the server does: with
    # uvicorn's 5 s both ends closed at the same moment, and a request sent in that instant failed with
    # ReadError (measured: ~1 call in 2,000 at 64 concurrent agent sessions, bench.gateway)
    keep_alive_s: int = Field(default=75, gt=0)
    readyz_timeout_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)  # GET /readyz's database check
    # GET /healthz answers its last database check while younger than this (and while the next one runs,
    # up to healthz_fresh_s + readyz_timeout_s + 1 s): no probe request waits on the database
    healthz_fresh_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    # auth (service.auth): on once any API key exists, or always with require_auth
    require_auth: bool = False
    metrics_public: bool = False  # GET /metrics without a key (for a Prometheus scraper)
    # LLM-judge endpoints, configured by the deployment (a JSON map name -> endpoint); specs name one
    judge_endpoints: JudgeEndpoints = Field(default_factory=dict)
    worker_metrics_port: int | None = None  # a score worker serves its Prometheus metrics here when set
    # agent sessions (service.sessions): the upstream inference servers (one URL or a comma-separated list,
    # each ending in /v1; sticky per session), a call's deadline (retries with backoff inside it), per-session
    # limits (calls -> max_turns, prompt + completion tokens -> length, wall time -> timeout) and how long a
    # group waits for its missing sessions
    inference_url: str = ""
    session_call_timeout_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    session_retry_base_s: float = Field(default=0.2, gt=0, allow_inf_nan=False)
    session_max_calls: int = Field(default=64, ge=1)
    session_max_tokens: int = Field(default=131_072, ge=1)
    session_max_seconds: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    session_group_deadline_s: float = Field(default=7200.0, gt=0, allow_inf_nan=False)
    # also ask the upstream for SGLang's return_prompt_token_ids + return_meta_info (SGLang releases whose
    # chat route has no return_token_ids; docs/agents.md)
    inference_sglang_meta_info: bool = False
    # training-health alerts (service.alerts, docs/alerts.md): the window of policy versions every monitor
    # reads, how often the worker evaluates, the hysteresis (an alert resolves once its value is below
    # warning * alert_resolve_ratio), the cooldown (versions after a resolve before the same monitor
    # alerts again), whether an alert lifts itself when the monitor recovers, the 503's Retry-After of a
    # paused lease, and a Slack-compatible webhook every transition is posted to
    alert_window_versions: int = Field(default=50, ge=2, le=10_000)
    alert_evaluate_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    alert_resolve_ratio: float = Field(default=0.8, gt=0, le=1, allow_inf_nan=False)
    alert_cooldown_versions: int = Field(default=5, ge=0)
    alert_auto_resolve: bool = True
    alert_retry_after_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    alert_webhook_url: str | None = None
    alert_webhook_retries: int = Field(default=5, ge=0)
    # scoring requests (service.scoring.gate): pool tasks all of /v1/score + OpenRLHF may have queued or running
    # at once (None: 2 per pool process), and one key's scoring requests at once (429 + Retry-After beyond)
    score_pool_slots: int | None = Field(default=None, ge=1)
    score_max_in_flight_per_key: int = Field(default=8, ge=1)
    score_retry_after_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # exports (service.export): a page is also bounded by bytes of trajectory JSON, and a process streams at
    # most this many exports at once (429 + Retry-After beyond)
    export_batch_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    export_max_concurrent: int = Field(default=8, ge=1)
    export_retry_after_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    # request bodies: JSON objects + arrays per body (413 beyond, counted before parsing), and the JSON size of
    # one group's or trajectory's free-form metadata (422 naming the field)
    max_body_containers: int = Field(default=1_000_000, ge=1)
    max_metadata_bytes: int = Field(default=64 * 1024, ge=1)
    # archive (service.archive): with archive_url set (a directory or s3://bucket/prefix), the worker archives
    # groups in a final state older than retention (e.g. 7d) every archive_every_s seconds
    archive_url: str | None = None
    retention: str = "7d"
    archive_every_s: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    archive_batch_groups: int = Field(default=500, ge=1)
    # partitioned hot tables (service.store.partitions): group pks per range of trajectories / rewards /
    # decisions; the worker keeps one whole range ahead of the newest group and drops a range none of whose
    # groups is hot any more
    partition_groups: int = Field(default=100_000, ge=1)

    # bounds of a score / curate worker's transactions, set on its connections (service.store.db.worker_options):
    # one left idle this long (its worker frozen: SIGSTOP, a VM pause, a partition) is ended by the server with
    # its locks, so a frozen worker blocks the others' crash recovery at most this long; a lock wait, at most
    worker_idle_in_transaction_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    worker_lock_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)

    @field_validator("score_claim_seconds", "worker_poll_seconds", "score_backoff_base_s", "score_backoff_max_s",
                     "component_timeout_s", "lease_seconds_default")
    @classmethod
    def _worker_timing(cls, value: float, info) -> float:  # noqa: ANN001 - pydantic's ValidationInfo
        """Worker timings are finite and positive (inf / nan made every claim fail, <= 0 expire at once); a
        claim outlives its heartbeat (every third of it, at least MIN_BEAT_S apart)."""
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{info.field_name}: expected a finite number of seconds > 0, got {value!r}")
        if info.field_name == "score_claim_seconds" and value <= 3 * MIN_BEAT_S:
            raise ValueError(f"score_claim_seconds: {value!r} s is within its heartbeat (renewed every third of the"
                             f" claim, at least {MIN_BEAT_S:g} s apart): expected more than {3 * MIN_BEAT_S:g} s")
        return value

    @field_validator("max_score_attempts", "worker_batch_groups", "worker_processes")
    @classmethod
    def _worker_counts(cls, value: int, info) -> int:  # noqa: ANN001 - pydantic's ValidationInfo
        if value < 1:
            raise ValueError(f"{info.field_name}: expected at least 1, got {value!r}")
        return value

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        """A duration the archiver can use (its form and its range), refused here rather than in its thread."""
        parse_duration(value, "retention (GRPO_CURATOR_RETENTION)")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: str) -> str:
        return normalize_log_level(value)

    @property
    def embedded_dir(self) -> Path:
        return self.data_dir / "pgdata"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()

"""ORM models (SQLAlchemy 2). The schema itself is created only by Alembic migrations.

Lifecycle of a group: received -> scored -> ready | dropped -> leased -> consumed; ``reward_error`` when a
component kept failing (or its spec could not be resolved); ``curation_error`` when curation raised for it.
Token ids / loss masks / log-probs are raw little-endian bytea (see service.store.arrays).
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    case,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}




class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONB, list[Any]: JSONB}


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class Dataset(Base):
    __tablename__ = "datasets"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    reward_spec: Mapped[str | None] = mapped_column(Text)  # "name" (latest) or "name@version"
    curation_policy: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class Prompt(Base):
    __tablename__ = "prompts"
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    dataset: Mapped[str] = mapped_column(Text, index=True)
    messages: Mapped[list[Any]] = mapped_column(JSONB)
    reference: Mapped[dict[str, Any]] = mapped_column(JSONB)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB)
    reward_spec: Mapped[str | None] = mapped_column(Text)
    curation_policy: Mapped[str | None] = mapped_column(Text)
    # running difficulty: mean outcome over recent groups, and how many groups were seen
    pass_rate: Mapped[float | None] = mapped_column(Float)
    n_groups: Mapped[int] = mapped_column(Integer, server_default="0")
    recent_outcomes: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    # provenance: the reference was written by an admin key (POST /v1/prompts, an admin's inline prompt);
    # only such a reference runs as code under a verifier.code spec (service.specs.references)
    reference_from_admin: Mapped[bool] = mapped_column(Boolean, server_default="false")


class RewardSpecRow(Base):
    __tablename__ = "reward_specs"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    body_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _now()


class CurationPolicyRow(Base):
    __tablename__ = "curation_policies"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    body_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _now()


class Group(Base):
    __tablename__ = "groups"
    __table_args__ = (
        Index("ix_groups_status_pk", "status", "pk"),
        Index("ix_groups_dataset_pk", "dataset", "pk"),
        Index("ix_groups_policy_version", "policy_version"),
        Index("ix_groups_waiting", "wait_until", postgresql_where=text("status = 'waiting'")),
    )
    pk: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    id: Mapped[str] = mapped_column(Text, unique=True)
    prompt_id: Mapped[str] = mapped_column(ForeignKey("prompts.id"), index=True)
    dataset: Mapped[str] = mapped_column(Text)
    policy_version: Mapped[int] = mapped_column(Integer)
    # the oldest policy version that generated any of its tokens, when older than policy_version (per-token
    # versions, a fill by an older policy; migration 0014); NULL: policy_version. Staleness reads
    # coalesce(oldest_version, policy_version) (``staleness_version``)
    oldest_version: Mapped[int | None] = mapped_column(Integer)
    sampling: Mapped[dict[str, Any]] = mapped_column(JSONB)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB)
    body_hash: Mapped[str] = mapped_column(String(64))
    producer_key: Mapped[str | None] = mapped_column(Text)  # the API key's name that posted it (audit)
    status: Mapped[str] = mapped_column(String(16), server_default="received")
    drop_reason: Mapped[str | None] = mapped_column(Text)
    n_trajectories: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(BigInteger)
    # what scored / curated it
    reward_spec_name: Mapped[str | None] = mapped_column(Text)
    reward_spec_version: Mapped[int | None] = mapped_column(Integer)
    curation_policy_name: Mapped[str | None] = mapped_column(Text)
    curation_policy_version: Mapped[int | None] = mapped_column(Integer)
    score_attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    score_error: Mapped[str | None] = mapped_column(Text)
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # backoff after a failed attempt
    # score-worker deaths while it was claimed alone (migration 0011; past max_solo_deaths: the killer)
    score_deaths: Mapped[int] = mapped_column(Integer, server_default="0")
    # the claim tokens of those deaths (migration 0011_death_tokens): a live worker's lapse is taken back
    death_tokens: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default="{}")
    # a score worker's claim (migration 0005): a token unique to the claim, and until when it holds
    claimed_by: Mapped[str | None] = mapped_column(Text)
    claimed_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    metric_std: Mapped[float | None] = mapped_column(Float)
    outcome_mean: Mapped[float | None] = mapped_column(Float)
    # delivery
    lease_id: Mapped[str | None] = mapped_column(Text, index=True)
    consumed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    staleness: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()
    scored_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    curated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ready_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # status 'waiting': remedy slots (resample / resume in place) are awaited until then (migration 0010)
    wait_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    # no foreign key: trajectories is partitioned, and an archived group's rows stay until its partition drops
    trajectories: Mapped[list[Trajectory]] = relationship(
        back_populates="group", lazy="raise", order_by="Trajectory.idx",
        primaryjoin="Group.pk == foreign(Trajectory.group_pk)",
    )


# The version a group's staleness is measured from: its oldest token's (see Group.oldest_version).
STALENESS_VERSION = func.coalesce(Group.oldest_version, Group.policy_version)


# The hot tables that hold the bytes -- trajectories, rewards, decisions (and prompt_prefixes, 0016) -- are
# partitioned by RANGE (group_pk) (migration 0015): groups.pk grows with time, so a pk range is a time range.
# Their partitions live in schema ``parts`` (``parts.<table>_p<lo>`` and ``parts.<table>_default``), one row
# each range in ``partitions``; the worker creates them ahead and drops a range once none of its groups is
# hot (service.store.partitions).
# They have no foreign key to groups: archiving deletes the groups row only, and the range's rows go with
# the partition (no bulk DELETE). Every read reaches them through a live group's pk.
PARTITIONED = {"postgresql_partition_by": "RANGE (group_pk)"}


class PromptPrefix(Base):
    """The leading tokens every member of a group shares -- byte for byte in token_ids, loss_mask, logprobs and
    versions: its prompt, as a rule -- stored once for the group (migration 0016). A member whose
    ``prefix_len`` is n > 0 stores only what follows its first n tokens; ``Trajectory.token_ids`` & co. put
    the two back together in SQL. Partitioned like trajectories, so its rows go with their range's DROP."""

    __tablename__ = "prompt_prefixes"
    __table_args__ = PARTITIONED
    group_pk: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    loss_mask: Mapped[bytes | None] = mapped_column(LargeBinary)
    logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    versions: Mapped[bytes | None] = mapped_column(LargeBinary)


def _whole(name: str, stored: Any, group_pk: Any, prefix_len: Any) -> Any:
    """A member's whole array: its stored bytes, after its group's shared prefix when it has one (bytea ||)."""
    shared = (select(PromptPrefix.__table__.c[name]).where(PromptPrefix.__table__.c.group_pk == group_pk)
              .scalar_subquery())
    whole = case((prefix_len == 0, stored), else_=shared.op("||", return_type=LargeBinary)(stored))
    return whole.label(name)  # named like the column, in a select and in a subquery of one


class Trajectory(Base):
    __tablename__ = "trajectories"
    __table_args__ = PARTITIONED
    group_pk: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    idx: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    messages: Mapped[list[Any]] = mapped_column(JSONB)
    final_answer: Mapped[str] = mapped_column(Text)
    # the stored arrays: the whole member when prefix_len is 0, else what follows its group's PromptPrefix
    # (written by service.ingest only; read token_ids / loss_mask / logprobs / versions below)
    stored_token_ids: Mapped[bytes | None] = mapped_column("token_ids", LargeBinary)
    stored_loss_mask: Mapped[bytes | None] = mapped_column("loss_mask", LargeBinary)
    stored_logprobs: Mapped[bytes | None] = mapped_column("logprobs", LargeBinary)
    seq_len: Mapped[int] = mapped_column(Integer)
    num_tokens: Mapped[int] = mapped_column(Integer)  # model-generated tokens
    num_turns: Mapped[int] = mapped_column(SmallInteger)
    finish_reason: Mapped[str] = mapped_column(String(16))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB)
    total_reward: Mapped[float | None] = mapped_column(Float)
    outcome: Mapped[float | None] = mapped_column(Float)
    advantage: Mapped[float | None] = mapped_column(Float)
    action: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    # a segmented trajectory: token_ids / loss_mask / logprobs hold its segments concatenated in order;
    # segments = [{"length": n, "messages": [...] | null}, ...] cuts them apart (None: not segmented)
    segments: Mapped[list[Any] | None] = mapped_column(JSONB)
    segment_advantages: Mapped[list[Any] | None] = mapped_column(JSONB)  # one per segment, set by curation
    # per-token policy versions (int32 bytea, -1: not generated by the model); None: not given (0010)
    stored_versions: Mapped[bytes | None] = mapped_column("versions", LargeBinary)
    # how many leading tokens live in the group's PromptPrefix row (0: none, the arrays are whole; 0016)
    prefix_len: Mapped[int] = mapped_column(Integer, server_default="0")

    # the whole arrays, read-only: a select of these (or a loaded object) gets exactly the bytes posted
    token_ids: Mapped[bytes | None] = column_property(_whole("token_ids", stored_token_ids, group_pk, prefix_len))
    loss_mask: Mapped[bytes | None] = column_property(_whole("loss_mask", stored_loss_mask, group_pk, prefix_len))
    logprobs: Mapped[bytes | None] = column_property(_whole("logprobs", stored_logprobs, group_pk, prefix_len))
    versions: Mapped[bytes | None] = column_property(_whole("versions", stored_versions, group_pk, prefix_len))

    group: Mapped[Group] = relationship(back_populates="trajectories", lazy="raise",
                                        primaryjoin="Group.pk == foreign(Trajectory.group_pk)")


class Reward(Base):
    __tablename__ = "rewards"
    __table_args__ = (
        PrimaryKeyConstraint("group_pk", "pk", name="pk_rewards"),  # the partition key leads (0015)
        UniqueConstraint("group_pk", "idx", "spec_name", "spec_version", "component", name="uq_rewards_key"),
        PARTITIONED,
    )
    pk: Mapped[int] = mapped_column(BigInteger, Identity())
    group_pk: Mapped[int] = mapped_column(BigInteger)
    idx: Mapped[int] = mapped_column(SmallInteger)
    spec_name: Mapped[str] = mapped_column(Text)
    spec_version: Mapped[int] = mapped_column(Integer)
    component: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    value: Mapped[float | None] = mapped_column(Float)
    details: Mapped[dict[str, Any]] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = _now()


class Decision(Base):
    __tablename__ = "decisions"
    __table_args__ = (PrimaryKeyConstraint("group_pk", "pk", name="pk_decisions"), PARTITIONED)  # 0015
    pk: Mapped[int] = mapped_column(BigInteger, Identity())
    group_pk: Mapped[int] = mapped_column(BigInteger)
    idx: Mapped[int | None] = mapped_column(SmallInteger)  # None: about the whole group
    policy_name: Mapped[str | None] = mapped_column(Text)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))
    rule: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Lease(Base):
    __tablename__ = "leases"
    # the reaper's scan: only active leases, so acked history never slows it down (migration 0002)
    __table_args__ = (
        Index("ix_leases_active_expires_at", "expires_at", postgresql_where=text("status = 'active'")),
    )
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    trainer_id: Mapped[str] = mapped_column(Text)
    api_key: Mapped[str | None] = mapped_column(Text)  # the name of the key that took it; only it (or admin) acks
    request_id: Mapped[str | None] = mapped_column(Text, unique=True)
    status: Mapped[str] = mapped_column(String(16), server_default="active")  # active|acked|nacked|expired
    group_pks: Mapped[list[Any]] = mapped_column(JSONB)
    n_groups: Mapped[int] = mapped_column(Integer)
    n_trajectories: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(BigInteger)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str | None] = mapped_column(Text)  # why a trainer nacked it


class PolicyState(Base):
    __tablename__ = "policy_versions"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONB)
    publisher_key: Mapped[str | None] = mapped_column(Text)  # the API key's name that published it (audit)
    created_at: Mapped[datetime] = _now()


class ApiKey(Base):
    """An API key: the token is ``gck_<id>_<secret>``; only sha256(secret) is stored (service.auth)."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    role: Mapped[str] = mapped_column(String(16))
    datasets: Mapped[list[Any] | None] = mapped_column(JSONB)  # None: every dataset
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SamplingRequest(Base):
    __tablename__ = "sampling_requests"
    __table_args__ = (
        Index("ix_sampling_requests_status_priority", "status", "priority"),
        Index("ix_sampling_requests_slot", "source_group_pk", "idx", postgresql_where=text("idx IS NOT NULL")),
    )
    pk: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # None: "any prompt of the dataset" (a refill), resolved by the curriculum when a producer takes it
    prompt_id: Mapped[str | None] = mapped_column(ForeignKey("prompts.id", ondelete="CASCADE"), index=True)
    dataset: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)  # refill | resample | resume
    n: Mapped[int] = mapped_column(Integer)
    budget: Mapped[dict[str, Any]] = mapped_column(JSONB)
    priority: Mapped[float] = mapped_column(Float, server_default="1.0")
    source_group_pk: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), server_default="open")  # open|taken|done|expired
    taken_by: Mapped[str | None] = mapped_column(Text)
    taken_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    # a remedy slot (migration 0010): resample / resume fill trajectory idx of group source_group_pk
    idx: Mapped[int | None] = mapped_column(SmallInteger)
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # resume: the state to continue from
    filled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    fill_hash: Mapped[str | None] = mapped_column(String(64))


class StatsCell(Base):
    """Pre-aggregated reward statistics (service.stats.service), maintained as groups are curated.

    One row per (dim, key, dataset, bucket): dim 'policy_version' (key = the version), 'finish_reason'
    (key = the reason) or 'all' (key ''); bucket the hour of the groups' created_at, or 1970-01-01 for the
    all-time cells; dataset '' (all-time cells only) for every dataset together. ``counters`` is a flat map
    of additive counters (sums, sums of squares, counts, sparse histogram buckets): cells merge by adding.
    """

    __tablename__ = "stats_cells"
    dim: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    dataset: Mapped[str] = mapped_column(Text, primary_key=True)
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    counters: Mapped[dict[str, Any]] = mapped_column(JSONB)
    # a new value from a sequence at every write: (cell, version) names one content, across rebuilds too
    version: Mapped[int] = mapped_column(
        BigInteger, server_default=text("nextval('stats_cells_version_seq')")
    )
    updated_at: Mapped[datetime] = _now()


class AgentSession(Base):
    """An agent episode run through the gateway (service.sessions); its token is ``gcs_<id>_<secret>``,
    only sha256(secret) stored. Status open -> finished (-> ingested_at set once its group is posted)."""

    __tablename__ = "agent_sessions"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    group_id: Mapped[str] = mapped_column(Text, index=True)
    group_size: Mapped[int] = mapped_column(Integer)
    prompt_id: Mapped[str] = mapped_column(Text)
    prompt: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # an inline prompt, posted with the group
    dataset: Mapped[str | None] = mapped_column(Text)
    policy_version: Mapped[int] = mapped_column(Integer)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB)
    producer_key: Mapped[str | None] = mapped_column(Text)
    producer_role: Mapped[str] = mapped_column(String(16))
    producer_datasets: Mapped[list[Any] | None] = mapped_column(JSONB)
    upstream: Mapped[str] = mapped_column(Text)  # sticky: every call of the session goes there
    status: Mapped[str] = mapped_column(String(16), server_default="open")
    n_calls: Mapped[int] = mapped_column(Integer, server_default="0")
    n_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    misuse: Mapped[str | None] = mapped_column(Text)  # the first tool misuse the gateway saw
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    final_answer: Mapped[str | None] = mapped_column(Text)
    rewards: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ingested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # a resume session: {"group_id", "index", "request_id"} of the slot it fills (docs/agents.md)
    resume: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class SessionCall(Base):
    """One call a session made, stored before its answer went back (token arrays as service.store.arrays)."""

    __tablename__ = "session_calls"
    session_id: Mapped[str] = mapped_column(ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # chat | completions
    request: Mapped[dict[str, Any]] = mapped_column(JSONB)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    prompt_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    completion_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    finish_reason: Mapped[str | None] = mapped_column(Text)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    upstream: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    latency_ms: Mapped[float] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    misuse: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
class MonitorSetting(Base):
    """An admin's thresholds / action for one monitor (service.alerts), overall (scope '') or one dataset."""

    __tablename__ = "monitor_settings"
    monitor: Mapped[str] = mapped_column(Text, primary_key=True)
    scope: Mapped[str] = mapped_column(Text, primary_key=True)  # '' = every dataset together, else a dataset
    warning: Mapped[float | None] = mapped_column(Float)  # None: inherit (overall row, then the default)
    critical: Mapped[float | None] = mapped_column(Float)
    action: Mapped[str | None] = mapped_column(String(16))  # notify | pause_leases; None: inherit
    pause_scope: Mapped[str | None] = mapped_column(String(16))  # overall row: per_dataset | None (all)
    updated_at: Mapped[datetime] = _now()


class Alert(Base):
    """One alert episode of a monitor in a scope: warning -> critical -> resolved (service.alerts)."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_open", "monitor", "dataset", "state"),)
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    monitor: Mapped[str] = mapped_column(Text)
    dataset: Mapped[str | None] = mapped_column(Text)  # None: every dataset together
    state: Mapped[str] = mapped_column(String(16))  # warning | critical | resolved
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    opened_version: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)  # the policy version of the last transition
    value: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float | None] = mapped_column(Float)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now()


class AlertTransition(Base):
    """Every state change of an alert, one row each (from 'ok' when it opened)."""

    __tablename__ = "alert_transitions"
    pk: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    alert_id: Mapped[str] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    version: Mapped[int] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)  # monitor | admin:<key name>
    at: Mapped[datetime] = _now()
    notified_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # None: in the webhook outbox
    notify_attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    notify_after: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # the next try, after a failure

    __table_args__ = (Index("ix_alert_transitions_unnotified", "pk", postgresql_where=text("notified_at IS NULL")),)


class AlertCursor(Base):
    """The policy version the alerts were last evaluated at (one row, name 'evaluate'): a spike monitor
    scores every version since (service.alerts)."""

    __tablename__ = "alert_cursor"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    since: Mapped[int | None] = mapped_column(Integer)  # the cursor that evaluation started from


class ArchiveFile(Base):
    """A Parquet file the archiver recorded (service.archive): ``kind`` all | effective, one dataset and day."""

    __tablename__ = "archive_files"
    __table_args__ = (Index("ix_archive_files_kind_first_pk", "kind", "first_pk"),)
    pk: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    location: Mapped[str] = mapped_column(Text, unique=True)  # the file's URL, as shown to clients
    uri: Mapped[str] = mapped_column(Text)  # what to open it with (the location plus the archive URL's query)
    kind: Mapped[str] = mapped_column(String(16))
    dataset: Mapped[str] = mapped_column(Text)
    day: Mapped[date] = mapped_column(Date)
    first_pk: Mapped[int] = mapped_column(BigInteger)
    last_pk: Mapped[int] = mapped_column(BigInteger)
    n_groups: Mapped[int] = mapped_column(Integer)
    n_rows: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()


class ArchiveIdentity(Base):
    """This database's name on archive targets (one row, name 'archive'; service.archive): a random id that
    every file it archives carries in its name, so that databases sharing a target neither overwrite nor
    delete each other's files. ``database_oid``: the database it was drawn in; a copy (CREATE DATABASE ...
    TEMPLATE) or a restore elsewhere draws a new one rather than claim the original's files."""

    __tablename__ = "archive_identity"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    id: Mapped[str] = mapped_column(String(32))
    database_oid: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _now()


class GroupTombstone(Base):
    """What is left in PostgreSQL of an archived group: enough to answer its id (idempotency, GET)."""

    __tablename__ = "group_tombstones"
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    pk: Mapped[int] = mapped_column(BigInteger)
    body_hash: Mapped[str] = mapped_column(String(64))
    prompt_id: Mapped[str] = mapped_column(Text)
    dataset: Mapped[str] = mapped_column(Text)
    policy_version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # the final status it had when archived
    drop_reason: Mapped[str | None] = mapped_column(Text)
    n_trajectories: Mapped[int] = mapped_column(Integer)
    group_created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    file_pk: Mapped[int] = mapped_column(ForeignKey("archive_files.pk"), index=True)
    archived_at: Mapped[datetime] = _now()


class StatsArchivedCell(Base):
    """The archived groups' share of the stats rollup (``StatsCell``'s key and counters), kept for a rebuild."""

    __tablename__ = "stats_archived_cells"
    dim: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    dataset: Mapped[str] = mapped_column(Text, primary_key=True)
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    counters: Mapped[dict[str, Any]] = mapped_column(JSONB)


class HotPartition(Base):
    """One range of the partitioned hot tables (migration 0015, service.store.partitions): groups with
    ``lo_pk <= pk < hi_pk`` keep their trajectories, rewards and decisions in ``parts.<table>_p<lo_pk>``.
    ``opened_at``: when its first group came (about; NULL: none yet), so a pk range reads as a time range;
    ``dropped_at``: when its partitions were dropped (every group of the range archived; the row stays)."""

    __tablename__ = "partitions"
    lo_pk: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    hi_pk: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _now()
    opened_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dropped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

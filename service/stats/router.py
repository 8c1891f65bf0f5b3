"""GET /v1/stats (reward statistics from the pre-aggregated rollup) and POST /v1/stats/rebuild."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from service.api.deps import SessionDep
from service.auth.service import ADMIN, VIEWER, allow
from service.stats import service as stats
from service.stats.service import StatsBy
from service.store.db import statements_on_their_own

router = APIRouter(prefix="/v1/stats", tags=["stats"])



class Distribution(BaseModel):
    """Exact count / mean / population std; quantiles interpolate like numpy (exact for multiples of 1/8
    up to 64, else within 2 % relative)."""

    count: int
    mean: float | None
    std: float | None
    p10: float | None
    p50: float | None
    p90: float | None


class ComponentStats(Distribution):
    error_rate: float | None
    length_reward_corr: float | None


class LengthStats(BaseModel):
    mean: float | None
    p90: float | None


class StatsRow(BaseModel):
    """One row per key. by=component rows carry the component's distribution (count, mean, std, p10,
    p50, p90), error_rate and length_reward_corr; the other rows carry the rest."""

    key: int | str
    count: int
    total: Distribution | None = None
    components: dict[str, ComponentStats] | None = None
    pass_rate: float | None = None
    zero_variance_fraction: float | None = None
    drop_fraction: dict[str, float] | None = None
    truncation_rate: dict[str, float] | None = None
    length: LengthStats | None = None
    length_reward_corr: float | None = None
    mean: float | None = None
    std: float | None = None
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    error_rate: float | None = None


class StatsOut(BaseModel):
    by: StatsBy
    dataset: str | None
    since: str | None
    rows: list[StatsRow]
    remedies: dict[str, dict[str, int]] | None = Field(
        None, description="remedy decision rows by remedy (resample, resume) and step (requested, filled, "
                          "unfilled, exhausted)")


class RebuildOut(BaseModel):
    groups: int
    cells: int


@router.get("", response_model=StatsOut, response_model_exclude_unset=True, dependencies=[allow(VIEWER, dataset="dataset")])
def get_stats(
    session: SessionDep,
    by: StatsBy = "dataset",
    dataset: Annotated[str | None, Query(min_length=1, max_length=512)] = None,
    since: Annotated[
        datetime | None, Query(description="ISO time; applied at hour granularity (UTC)")
    ] = None,
) -> dict[str, Any]:
    """Rows per key; fields a `by` does not have are left out (see StatsRow)."""
    # reads only, each statement of the rollup on its own (its cells are additive counters): no BEGIN and no
    # COMMIT round trips, which were a third of the request's waits on PostgreSQL (py-spy, a stats loop)
    statements_on_their_own(session)
    try:
        out = stats.get_stats(session, by, dataset, since)  # validated and serialised once, by response_model
    except BaseException:
        session.rollback()  # a commit on a connection the database ended would replace its error (a 503) with a 500
        raise
    session.commit()  # nothing to commit: ends the session's transaction in this thread, not in another hop
    return out


@router.post("/rebuild", response_model=RebuildOut, dependencies=[allow(ADMIN)])
def rebuild_stats(session: SessionDep) -> RebuildOut:
    """Recompute the rollup from the stored groups (after a migration, or to check it)."""
    return RebuildOut(**stats.rebuild(session))

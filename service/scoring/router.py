"""Synchronous scoring and OpenRLHF's remote reward protocol (docs/integrations.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from service.api.deps import SessionDep, SettingsDep, get_scorer
from service.auth.service import PRODUCER, TRAINER, KeyDep, allow
from service.scoring import openrlhf
from service.scoring.schemas import OpenRLHFIn, OpenRLHFOut, ScoreIn, ScoreOut
from service.scoring.service import ScoreLimits, ScoreRun, score_items

router = APIRouter(tags=["integrations"])


def score_run(request: Request) -> ScoreRun:
    """The Scorer with the app's scoring threads, this deployment's limits and reference opt-ins."""
    s = request.app.state.settings
    return ScoreRun(get_scorer(request), request.app.state.score_executor, ScoreLimits.of(s),
                    frozenset(s.caller_reference_specs), getattr(request.app.state, "score_gate", None))


ScoreRunDep = Annotated[ScoreRun, Depends(score_run)]


@router.post("/v1/score", response_model=ScoreOut, dependencies=[allow(PRODUCER, TRAINER)],
             responses={413: {"description": "more items than max_score_items, or more pool time than "
                                             "score_pool_budget_s: send fewer items"},
                        403: {"description": "store with a key that is not a producer's, or a reference the "
                                             "spec runs as code from a key that may not supply one"},
                        429: {"description": "the key has score_max_in_flight_per_key requests in flight; "
                                             "retry after Retry-After seconds"}})
async def post_score(body: ScoreIn, session: SessionDep, run: ScoreRunDep, key: KeyDep) -> ScoreOut:
    return await score_items(session, run, body, key)


# the trailing-slash form too: Starlette's slash redirect (307) would send OpenRLHF's client to the path without
# the key it carried in the path (/compat/openrlhf/key/K/...: the key is moved to a header before routing)
@router.post("/compat/openrlhf/{spec}/get_reward/", response_model=OpenRLHFOut, dependencies=[allow(PRODUCER, TRAINER)],
             response_model_exclude_none=True, include_in_schema=False)
@router.post("/compat/openrlhf/{spec}/get_reward", response_model=OpenRLHFOut, dependencies=[allow(PRODUCER, TRAINER)],
             response_model_exclude_none=True,
             responses={503: {"description": "an item could not be scored (openrlhf_on_error=fail)"},
                        413: {"description": "more queries than max_score_items, or more pool time than "
                                             "score_pool_budget_s: send fewer queries"},
                        429: {"description": "the key has score_max_in_flight_per_key requests in flight; "
                                             "retry after Retry-After seconds"}})
async def post_openrlhf_reward(spec: Annotated[str, Path(min_length=1)], body: OpenRLHFIn, session: SessionDep,
                               run: ScoreRunDep, settings: SettingsDep, key: KeyDep) -> OpenRLHFOut:
    return await openrlhf.get_reward(session, run, spec, body, on_error=settings.openrlhf_on_error,
                                     error_value=settings.openrlhf_error_value,
                                     eos_means_stop=settings.openrlhf_eos_means_stop, key=key,
                                     extra_logs=settings.openrlhf_extra_logs)

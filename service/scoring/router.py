"""Synchronous scoring and OpenRLHF's remote reward protocol (docs/integrations.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service.api.deps import ScorerDep, SessionDep, SettingsDep
from service.auth.service import PRODUCER, TRAINER, allow
from service.scoring import openrlhf
from service.scoring.schemas import OpenRLHFIn, OpenRLHFOut, ScoreIn, ScoreOut
from service.scoring.service import ScoreLimits, score_items

router = APIRouter(tags=["integrations"])


@router.post("/v1/score", response_model=ScoreOut, dependencies=[allow(PRODUCER, TRAINER)],
             responses={413: {"description": "more items than max_score_items, or more pool time than "
                                             "score_pool_budget_s: send fewer items"}})
def post_score(body: ScoreIn, session: SessionDep, scorer: ScorerDep, settings: SettingsDep) -> ScoreOut:
    return score_items(session, scorer, body, ScoreLimits.of(settings))


@router.post("/compat/openrlhf/{spec}/get_reward", response_model=OpenRLHFOut, dependencies=[allow(PRODUCER, TRAINER)],
             responses={503: {"description": "an item could not be scored (openrlhf_on_error=fail)"},
                        413: {"description": "more queries than max_score_items, or more pool time than "
                                             "score_pool_budget_s: send fewer queries"}})
def post_openrlhf_reward(spec: Annotated[str, Path(min_length=1)], body: OpenRLHFIn, session: SessionDep,
                         scorer: ScorerDep, settings: SettingsDep) -> OpenRLHFOut:
    return openrlhf.get_reward(session, scorer, spec, body, on_error=settings.openrlhf_on_error,
                               error_value=settings.openrlhf_error_value, limits=ScoreLimits.of(settings),
                               eos_means_stop=settings.openrlhf_eos_means_stop)

"""POST /v1/rescore and /v1/recurate: send stored groups through scoring or curation again."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import SessionDep, SettingsDep
from service.api.schemas import INT4_MAX, MAX_RESCORE_IDS, Key, Name
from service.auth.service import ADMIN, allow
from service.scoring import rescore

router = APIRouter(prefix="/v1", tags=["rescore"])


class GroupFilter(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    dataset: Name | None = None
    group_ids: list[Key] | None = Field(default=None, min_length=1, max_length=MAX_RESCORE_IDS)
    policy_version: int | None = Field(default=None, ge=0, le=INT4_MAX)

    def filters(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "group_ids": self.group_ids, "policy_version": self.policy_version}


class RescoreIn(GroupFilter):
    reward_spec: Name


class RecurateIn(GroupFilter):
    curation_policy: Name


@router.post("/rescore", dependencies=[allow(ADMIN)],
             responses={403: {"description": "the spec runs references as code and a matching group's reference "
                                             "was not loaded by an admin key (docs/security.md)"}})
def post_rescore(body: RescoreIn, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    return rescore.rescore(session, body.reward_spec, frozenset(settings.caller_reference_specs), **body.filters())


@router.post("/recurate", dependencies=[allow(ADMIN)])
def post_recurate(body: RecurateIn, session: SessionDep) -> dict[str, Any]:
    return rescore.recurate(session, body.curation_policy, **body.filters())

"""Reward specs, curation policies and dataset attachments."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict

from filters.policy import CurationPolicySpec
from reward_models.spec import RewardSpec
from service.api.deps import SessionDep, SettingsDep
from service.api.schemas import Name, PathName, VersionQuery
from service.auth.service import ADMIN, TRAINER, VIEWER, allow
from service.specs import service as specs

router = APIRouter(prefix="/v1", tags=["specs"])


class VersionOut(BaseModel):
    name: str
    version: int


class VersionedOut(VersionOut):
    body: dict[str, Any]


class DatasetIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reward_spec: Name | None = None
    curation_policy: Name | None = None


class DatasetOut(DatasetIn):
    name: str


_SAME_BODY = {200: {"description": "equal to the latest version: that version, nothing new stored"}}


@router.post("/reward-specs", response_model=VersionOut, status_code=201, responses=_SAME_BODY, dependencies=[allow(ADMIN)])
def post_reward_spec(body: RewardSpec, session: SessionDep, settings: SettingsDep, response: Response) -> VersionOut:
    v = specs.create_reward_spec(session, body, settings.judge_endpoints)
    response.status_code = 201 if v.created else 200
    return VersionOut(name=v.name, version=v.version)


@router.get("/reward-specs/{name:path}", response_model=VersionedOut, dependencies=[allow(VIEWER, TRAINER)])
def get_reward_spec(name: PathName, session: SessionDep, version: VersionQuery = None) -> VersionedOut:
    v = specs.get_versioned(session, "reward_spec", name, version)
    return VersionedOut(name=v.name, version=v.version, body=v.body)


@router.post("/curation-policies", response_model=VersionOut, status_code=201, responses=_SAME_BODY, dependencies=[allow(ADMIN)])
def post_curation_policy(body: CurationPolicySpec, session: SessionDep, response: Response) -> VersionOut:
    v = specs.create_curation_policy(session, body)
    response.status_code = 201 if v.created else 200
    return VersionOut(name=v.name, version=v.version)


@router.get("/curation-policies/{name:path}", response_model=VersionedOut, dependencies=[allow(VIEWER)])
def get_curation_policy(name: PathName, session: SessionDep, version: VersionQuery = None) -> VersionedOut:
    v = specs.get_versioned(session, "curation_policy", name, version)
    return VersionedOut(name=v.name, version=v.version, body=v.body)


@router.put("/datasets/{name:path}", response_model=DatasetOut, dependencies=[allow(ADMIN)])
def put_dataset(name: PathName, body: DatasetIn, session: SessionDep) -> DatasetOut:
    return DatasetOut(**specs.set_dataset(session, name, body.reward_spec, body.curation_policy))


@router.get("/datasets/{name:path}", response_model=DatasetOut, dependencies=[allow(VIEWER, dataset="name")])
def get_dataset(name: PathName, session: SessionDep) -> DatasetOut:
    return DatasetOut(**specs.get_dataset(session, name))

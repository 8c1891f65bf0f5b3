"""Liveness / readiness."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from service.api.deps import SessionDep
from service.auth.service import public

router = APIRouter(tags=["health"])


@router.get("/healthz", dependencies=[public()])
def healthz(session: SessionDep) -> dict[str, str]:
    revision = session.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none()
    return {"status": "ok", "schema": revision or "none"}

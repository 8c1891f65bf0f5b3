"""One error type with a status code, rendered by one handler as ``{"error", "detail"}``."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status_code: int = 400

    def __init__(self, message: str, status_code: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code
        self.detail = detail


class BadRequest(ServiceError):
    status_code = 422


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class GroupConflict(Conflict):
    pass


class LeaseConflict(Conflict):
    pass


class Unauthorized(ServiceError):
    status_code = 401


class Forbidden(ServiceError):
    status_code = 403

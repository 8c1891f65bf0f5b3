"""The OpenAPI document: FastAPI's, completed.

- Schemas a route names by hand (``POST /v1/groups`` takes one group or ``{"groups": [...]}`` and
  documents its body as ``oneOf`` two ``$ref``s) are added to ``components.schemas``, so every
  ``$ref`` resolves.
- Every request body carries the examples of ``service.api.examples``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.api.errors import document_errors
from service.api.examples import EXTRA_EXAMPLES, REQUEST_EXAMPLES, STATEFUL_EXAMPLES

REF_PREFIX = "#/components/schemas/"


def _extra_models() -> list[type[BaseModel]]:
    from service.ingest.schemas import GroupIn, GroupsIn

    return [GroupIn, GroupsIn]


def add_schemas(doc: dict[str, Any], models: list[type[BaseModel]]) -> None:
    """Put ``models`` (and every model they use) into ``components.schemas`` unless already there."""
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF_PREFIX + "{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        schemas.setdefault(name, schema)


def add_examples(doc: dict[str, Any]) -> None:
    for (method, path), (summary, body) in {**REQUEST_EXAMPLES, **STATEFUL_EXAMPLES}.items():
        op = doc.get("paths", {}).get(path, {}).get(method)
        if op is None or "requestBody" not in op:
            continue
        media = op["requestBody"]["content"].setdefault("application/json", {})
        examples = {"example": {"summary": summary, "value": body}}
        for name, (extra_summary, extra_body) in EXTRA_EXAMPLES.get((method, path), {}).items():
            examples[name] = {"summary": extra_summary, "value": extra_body}
        media["examples"] = examples


def missing_refs(doc: dict[str, Any]) -> set[str]:
    """Names of ``#/components/schemas/...`` references that the document does not define."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(REF_PREFIX):
                found.add(ref[len(REF_PREFIX) :])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return found - set(doc.get("components", {}).get("schemas", {}))


def install(app: FastAPI) -> None:
    """Replace ``app.openapi`` with the completed document (built once, then cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                routes=app.routes,
                description="Trajectory curation and reward service for GRPO-style RL. "
                "The guides are in the repository's docs/ folder (docs/api.md: every request body).",
            )
            add_schemas(doc, _extra_models())
            add_examples(doc)
            document_errors(doc, extra_models=tuple(_extra_models()))  # every error status, ErrorOut
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

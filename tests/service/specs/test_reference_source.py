"""Who may supply a reference a reward spec runs as code, and who may create groups through /v1/score.

For a spec with a ``verifier.code`` component, ``tests`` / ``prompt`` / ``io`` come only from prompts an
admin key loaded, unless the deployment lists the spec in ``caller_reference_specs``: a producer's inline
prompt, a /v1/score item and an OpenRLHF label carrying them are refused (403 naming the field), and nothing
of the request is stored. ``store: true`` needs a producer key, whose name is recorded on the groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.api.deps import get_session
from service.app import create_app
from service.auth import keys
from service.settings import Settings
from service.store.models import Group, Prompt
from tests.helpers import make_group

CODE_SPEC = {"name": "code", "components": [{"name": "tests", "kind": "verifier.code", "outcome": True}]}
MATH_SPEC = {"name": "math", "components": [{"name": "correct", "kind": "verifier.math", "outcome": True}]}
HOSTILE = {"tests": "assert candidate(2, 3) == 5  # any source: it runs on the scoring side\n", "entry_point": "add"}


@pytest.fixture
def make_client(session: Session, db_url: str) -> Iterator[Callable[..., TestClient]]:
    """A TestClient of an app with ``settings`` overrides, on the test's rolled-back session."""
    opened: list[TestClient] = []

    def joined_session() -> Iterator[Session]:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise

    def make(**settings: object) -> TestClient:
        app = create_app(Settings(database_url=db_url, **settings), database_url=db_url)
        app.dependency_overrides[get_session] = joined_session
        client = TestClient(app)
        client.__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


@pytest.fixture
def tokens(session: Session) -> dict[str, dict[str, str]]:
    made = {role: keys.create_key(session, f"k-{role}", role) for role in ("admin", "producer", "trainer")}
    made["scoped"] = keys.create_key(session, "k-scoped", "producer", ["code"])
    session.commit()
    return {name: {"authorization": f"Bearer {token}"} for name, token in made.items()}


def _setup(c: TestClient, admin: dict[str, str]) -> None:
    for spec in (CODE_SPEC, MATH_SPEC):
        assert c.post("/v1/reward-specs", json=spec, headers=admin).status_code == 201
    assert c.put("/v1/datasets/code", json={"reward_spec": "code"}, headers=admin).status_code == 200


def _counts(session: Session) -> tuple[int, int]:
    return (session.scalar(select(func.count()).select_from(Prompt)),
            session.scalar(select(func.count()).select_from(Group)))


@pytest.mark.parametrize("who", ["producer", "scoped"])
@pytest.mark.parametrize("named", [True, False], ids=["spec-on-prompt", "spec-of-dataset"])
def test_a_producers_inline_prompt_may_not_bring_code_for_a_code_spec(make_client, tokens, session, who, named):
    c = make_client()
    _setup(c, tokens["admin"])
    group = make_group("g-code", prompt_id="p-code", dataset="code", reference=HOSTILE)
    if named:
        group["prompt"]["reward_spec"] = "code"
    r = c.post("/v1/groups", json=group, headers=tokens[who])
    assert r.status_code == 403, r.text
    assert r.json()["error"].startswith("prompt.reference.tests: reward spec 'code' runs its reference as code")
    assert _counts(session) == (0, 0)  # nothing of the request is stored


def test_an_admin_loaded_prompt_is_the_way_and_an_opted_in_spec_accepts_callers(make_client, tokens, session):
    c = make_client()
    _setup(c, tokens["admin"])
    prompt = {"id": "p-admin", "dataset": "code", "messages": [{"role": "user", "content": "add"}],
              "reference": HOSTILE}
    assert c.post("/v1/prompts", json={"prompts": [prompt]}, headers=tokens["admin"]).status_code == 200
    by_id = make_group("g-by-id", prompt_id="p-admin", dataset="code", inline_prompt=False)
    assert c.post("/v1/groups", json=by_id, headers=tokens["scoped"]).status_code == 201
    # an admin's own inline prompt may carry the reference; a math spec's reference is not run as code
    admin_inline = make_group("g-admin", prompt_id="p-admin-2", dataset="code", reference=HOSTILE)
    assert c.post("/v1/groups", json=admin_inline, headers=tokens["admin"]).status_code == 201
    math = make_group("g-math", prompt_id="p-math", dataset="toy", reference={**HOSTILE, "answer": "42"})
    math["prompt"]["reward_spec"] = "math"
    assert c.post("/v1/groups", json=math, headers=tokens["producer"]).status_code == 201
    opted = make_client(caller_reference_specs=["code"])
    inline = make_group("g-opt", prompt_id="p-opt", dataset="code", reference=HOSTILE)
    assert opted.post("/v1/groups", json=inline, headers=tokens["producer"]).status_code == 201


@pytest.mark.parametrize("who", ["producer", "trainer"])
@pytest.mark.parametrize("field", ["tests", "prompt", "io"])
def test_score_items_may_not_bring_code_for_a_code_spec(make_client, tokens, session, who, field):
    c = make_client()
    _setup(c, tokens["admin"])
    value = [{"input": "", "output": ""}] if field == "io" else HOSTILE["tests"]
    item = {"prompt": "add", "completion": "def add(a, b): return a + b", "reference": {field: value}}
    r = c.post("/v1/score", json={"reward_spec": "code", "items": [{"prompt": "x", "completion": "y"}, item],
                                  "store": who == "producer"}, headers=tokens[who])
    assert r.status_code == 403, r.text
    assert r.json()["error"].startswith(f"items[1].reference.{field}: reward spec 'code' runs its reference")
    assert _counts(session) == (0, 0)


def test_openrlhf_labels_may_not_bring_code_for_a_code_spec(make_client, tokens):
    c = make_client()
    _setup(c, tokens["admin"])
    body = {"query": ["Q: add\nA: x", "Q: add\nA: y"], "prompts": ["Q: add\nA:", "Q: add\nA:"],
            "labels": ["2", {"tests": HOSTILE["tests"]}]}
    r = c.post("/compat/openrlhf/code/get_reward", json=body, headers=tokens["trainer"])
    assert r.status_code == 403, r.text
    assert r.json()["error"].startswith("labels[1].tests: reward spec 'code' runs its reference as code")


def test_score_with_store_needs_a_producer_key_and_records_it(make_client, tokens, session):
    c = make_client()
    _setup(c, tokens["admin"])
    body = {"reward_spec": "math", "store": True,
            "items": [{"prompt": "6*7?", "completion": r"\boxed{42}", "reference": {"answer": "42"}}]}
    r = c.post("/v1/score", json=body, headers=tokens["trainer"])
    assert r.status_code == 403, r.text
    assert r.json()["error"].startswith("store: creating groups needs a producer key")
    assert _counts(session) == (0, 0)
    assert c.post("/v1/score", json={**body, "store": False}, headers=tokens["trainer"]).status_code == 200
    r = c.post("/v1/score", json=body, headers=tokens["producer"])
    assert r.status_code == 200, r.text
    stored = session.scalars(select(Group.producer_key)).all()
    assert stored == ["k-producer"]

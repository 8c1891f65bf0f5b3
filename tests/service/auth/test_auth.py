"""Auth: every route x every kind of key, generated from the routes' own declarations; key storage;
lease ownership; dataset scoping; a route without a declaration stops the app."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from service.app import create_app
from service.auth import keys
from service.auth import repository as key_repo
from service.auth.service import ANY, SERVICE, Access, Role, check_routes, declared_routes, split_token
from service.store.models import ApiKey, Group, Lease, PolicyState
from tests.helpers import bearer, make_group, secret_of
from tests.service.delivery.helpers import seed_ready

ROLES = [Role.producer, Role.trainer, Role.viewer, Role.admin]
DENIED = (401, 403)


def _routes(app: FastAPI) -> list[tuple[str, str, Access]]:
    routes = declared_routes(app)
    assert all(access is not None for _, _, access in routes)
    return routes  # type: ignore[return-value]


def _url(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path) + "?dataset=ds-a"


@pytest.fixture
def tokens(session: Session) -> dict[str, str]:
    """A key of each role, a revoked key, and keys of each non-admin role scoped to another dataset."""
    made = {role.value: keys.create_key(session, f"k-{role.value}", role.value) for role in ROLES}
    made["revoked"] = keys.create_key(session, "k-revoked", "admin")
    keys.revoke_key(session, "k-revoked")
    for role in ("producer", "trainer", "viewer"):
        made[f"scoped-{role}"] = keys.create_key(session, f"k-scoped-{role}", role, ["ds-other"])
    session.commit()  # releases the savepoint: a request that fails and rolls back keeps the keys
    return made


def _expected(column: str, access: Access) -> str:
    """'ok' (neither 401 nor 403), '401', '403' or 'not401' (the service decides, e.g. 403 / 404)."""
    if access.public:
        return "ok"
    if column in ("none", "revoked"):
        return "401"
    if column == "scoped":
        if access.dataset in (ANY,):
            return "ok"
        return "not401" if access.dataset == SERVICE else "403"
    return "ok" if access.admits(Role(column)) else "403"


def _scoped_key(access: Access) -> str:
    role = next((r for r in (Role.producer, Role.trainer, Role.viewer) if r in access.roles), Role.viewer)
    return f"scoped-{role.value}"


COLUMNS = ["none", "producer", "trainer", "viewer", "admin", "revoked", "scoped"]


def test_route_matrix(client: TestClient, tokens: dict[str, str]) -> None:
    """Every route x {no key, each role, revoked, scoped to another dataset}, from the declarations."""
    failures = []
    routes = _routes(client.app)  # type: ignore[arg-type]
    assert len(routes) >= 25
    for method, path, access in routes:
        for column in COLUMNS:
            token = {"none": None, "scoped": tokens[_scoped_key(access)]}.get(column, tokens.get(column))
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
            r = client.request(method, _url(path), headers=headers, **body)
            want = _expected(column, access)
            ok = {
                "ok": r.status_code not in DENIED,
                "401": r.status_code == 401,
                "403": r.status_code == 403,
                "not401": r.status_code != 401,
            }[want]
            if r.status_code in DENIED:  # the service's error format
                assert set(r.json()) == {"error", "detail"} and r.json()["error"]
            if not ok:
                failures.append(f"{method} {path} [{column}] -> {r.status_code}, expected {want}: {r.text[:120]}")
    assert not failures, "\n".join(failures)


def test_without_keys_everything_is_open_and_with_one_it_is_not(client: TestClient, session: Session) -> None:
    assert client.get("/v1/stats").status_code == 200
    keys.create_key(session, "first", "viewer")
    session.commit()
    r = client.get("/v1/stats")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert client.get("/healthz").status_code == 200


def test_revoking_the_last_key_keeps_auth_on(client: TestClient, session: Session) -> None:
    token = keys.create_key(session, "only", "admin")
    keys.revoke_key(session, "only")
    session.commit()
    assert client.get("/v1/stats").status_code == 401
    assert client.get("/v1/stats", headers={"Authorization": f"Bearer {token}"}).status_code == 401


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Basic dXNlcjpwYXNz", "Bearer gck_", "Bearer gck_" + "0" * 32 + "_", "Bearer nonsense", "bearer  "],
)
def test_malformed_or_forged_tokens_are_401(client: TestClient, tokens: dict[str, str], header: str) -> None:
    assert client.get("/v1/stats", headers={"Authorization": header}).status_code == 401


def test_a_valid_id_with_a_wrong_secret_is_401(client: TestClient, tokens: dict[str, str]) -> None:
    key_id, secret = split_token(tokens["admin"])  # type: ignore[misc]
    forged = f"gck_{key_id}_{secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}"
    assert client.get("/v1/stats", headers={"Authorization": f"Bearer {forged}"}).status_code == 401


def test_keys_are_stored_hashed_only(session: Session) -> None:
    token = keys.create_key(session, "h", "trainer", ["b", "a", "a"])
    key_id, secret = split_token(token)  # type: ignore[misc]
    row = session.get(ApiKey, key_id)
    assert row is not None and row.datasets == ["a", "b"] and row.role == "trainer"
    dump = str(session.execute(text("SELECT row_to_json(k)::text FROM api_keys k WHERE id = :i"), {"i": key_id}).scalar())
    assert secret not in dump and token not in dump
    assert len(secret) >= 40 and len({keys.create_key(session, f"h{i}", "viewer") for i in range(20)}) == 20


@pytest.mark.parametrize(
    ("name", "role", "datasets", "message"),
    [
        ("", "viewer", None, "name:"),
        ("a b", "viewer", None, "name:"),
        ("ok", "root", None, "role: unknown role 'root'"),
        ("ok", "admin", ["d"], "dataset: admin keys cannot be scoped"),
        ("ok", "viewer", [""], "dataset: empty"),
    ],
)
def test_bad_key_requests_name_the_field(session: Session, name, role, datasets, message) -> None:
    with pytest.raises(Exception, match=message):
        keys.create_key(session, name, role, datasets)
    assert key_repo.key_by_name(session, name) is None


def test_names_are_unique_and_revoke_is_by_name(session: Session) -> None:
    keys.create_key(session, "dup", "viewer")
    with pytest.raises(Exception, match="name: a key named 'dup' already exists"):
        keys.create_key(session, "dup", "admin")
    keys.revoke_key(session, "dup")
    with pytest.raises(Exception, match="no active key named 'dup'"):
        keys.revoke_key(session, "dup")


def test_producer_cannot_change_a_prompts_reference(client: TestClient, session: Session, tokens) -> None:
    producer = {"Authorization": f"Bearer {tokens['producer']}"}
    assert client.post("/v1/groups", json=make_group("a-1", prompt_id="p", reference={"answer": "1"}), headers=producer).status_code == 201
    for field, change in (("reference", {"reference": {"answer": "999"}}), ("messages", {"messages": [{"role": "user", "content": "easy"}]})):
        group = make_group("a-2", prompt_id="p", reference={"answer": "1"})
        group["prompt"].update(change)
        r = client.post("/v1/groups", json=group, headers=producer)
        assert r.status_code == 409 and r.json()["error"].startswith(f"prompt.{field}:"), r.text
    assert client.post("/v1/prompts", json={"prompts": []}, headers=producer).status_code == 403
    stored = session.execute(text("SELECT reference FROM prompts WHERE id = 'p'")).scalar()
    assert stored == {"answer": "1"}
    assert session.execute(select(Group.producer_key).where(Group.id == "a-1")).scalar() == "k-producer"
    assert session.execute(select(Group).where(Group.id == "a-2")).first() is None


def test_scoped_producer_posts_only_its_datasets(client: TestClient, session: Session, tokens) -> None:
    scoped = {"Authorization": f"Bearer {tokens['scoped-producer']}"}
    r = client.post("/v1/groups", json={"groups": [make_group("s-1", prompt_id="s", dataset="ds-other"),
                                                   make_group("s-2", prompt_id="t", dataset="ds-a")]}, headers=scoped)
    assert r.status_code == 403 and r.json()["error"].startswith("groups[1].prompt.dataset:")
    assert session.execute(select(Group).where(Group.id.in_(["s-1", "s-2"]))).first() is None  # all or nothing
    assert client.post("/v1/groups", json=make_group("s-1", prompt_id="s", dataset="ds-other"), headers=scoped).status_code == 201


def test_scoped_trainer_cannot_publish_the_global_policy(client: TestClient, session: Session, tokens) -> None:
    r = client.post("/v1/policy", json={"version": 2**31 - 1, "metrics": {}}, headers={"Authorization": f"Bearer {tokens['scoped-trainer']}"})
    assert r.status_code == 403
    r = client.post("/v1/policy", json={"version": 1, "metrics": {}}, headers={"Authorization": f"Bearer {tokens['trainer']}"})
    assert r.status_code == 201
    assert session.get(PolicyState, 1).publisher_key == "k-trainer"  # type: ignore[union-attr]


@pytest.fixture
def keyed(fresh_db: str) -> Iterator[tuple[TestClient, object, dict[str, str]]]:
    made = keys.provision(fresh_db, {"p": "producer", "t1": "trainer", "t2": "trainer", "adm": "admin"})
    engine = create_engine(fresh_db)
    with TestClient(create_app(database_url=fresh_db)) as c:
        yield c, engine, made
    engine.dispose()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_only_the_leasing_key_or_an_admin_ends_a_lease(keyed) -> None:
    c, engine, tok = keyed
    c.headers.update(_auth(tok["p"]))
    seed_ready(c, engine, 2, prefix="own")
    c.headers.pop("Authorization")
    r = c.post("/v1/batches/lease", json={"trainer_id": "x", "max_groups": 1, "request_id": "r1"}, headers=_auth(tok["t1"]))
    batch = r.json()["batch_id"]
    for action in ("ack", "nack"):
        r = c.post(f"/v1/batches/{batch}/{action}", headers=_auth(tok["t2"]))
        assert r.status_code == 403 and "another API key" in r.json()["error"]
    # replaying t1's request_id with t2's key does not hand t2 the batch
    r = c.post("/v1/batches/lease", json={"trainer_id": "x", "max_groups": 1, "request_id": "r1"}, headers=_auth(tok["t2"]))
    assert r.status_code == 403
    assert c.post(f"/v1/batches/{batch}/ack", headers=_auth(tok["t1"])).status_code == 200
    r = c.post("/v1/batches/lease", json={"trainer_id": "y", "max_groups": 1}, headers=_auth(tok["t2"]))
    assert c.post(f"/v1/batches/{r.json()['batch_id']}/nack", headers=_auth(tok["adm"])).status_code == 200
    with Session(engine) as s:
        assert s.get(Lease, batch).api_key == "t1"  # type: ignore[union-attr]


def test_scoped_trainer_leases_only_its_datasets(keyed, fresh_db: str) -> None:
    c, engine, tok = keyed
    token_b = keys.provision(fresh_db, {"t-b": "trainer"})["t-b"]
    with Session(engine) as s, s.begin():
        token_b = keys.create_key(s, "t-b-scoped", "trainer", ["b"])
    c.headers.update(_auth(tok["p"]))
    seed_ready(c, engine, 3, prefix="in-a", dataset="a")
    c.headers.pop("Authorization")
    r = c.post("/v1/batches/lease", json={"trainer_id": "b", "max_groups": 10}, headers=_auth(token_b))
    assert r.status_code == 204  # ready groups exist, none in dataset b
    r = c.post("/v1/batches/lease", json={"trainer_id": "any", "max_groups": 10}, headers=_auth(tok["t1"]))
    assert r.status_code == 200 and len(r.json()["groups"]) == 3


def test_a_route_without_a_declaration_stops_the_app() -> None:
    app = FastAPI()
    router = APIRouter()

    @router.get("/v1/forgotten")
    def forgotten() -> dict[str, str]:
        return {}

    app.include_router(router)
    with pytest.raises(RuntimeError, match="GET /v1/forgotten"):
        check_routes(app)


def test_a_plain_starlette_route_or_mount_stops_the_app_too() -> None:
    """Routes that cannot carry a declaration (FastAPI's own /openapi.json, a Mount) are refused as well."""
    from starlette.routing import Mount

    with pytest.raises(RuntimeError, match="GET /openapi.json"):
        check_routes(FastAPI())  # FastAPI's default openapi_url: an undeclared Starlette route
    app = FastAPI(openapi_url=None)
    app.router.routes.append(Mount("/files", app=FastAPI(openapi_url=None)))
    with pytest.raises(RuntimeError, match=r"\* /files"):
        check_routes(app)
    check_routes(FastAPI(openapi_url=None))  # nothing undeclared: starts


def test_metrics_can_be_opened_for_a_scraper_and_nothing_else(fresh_db: str) -> None:
    from service.settings import Settings

    keys.provision(fresh_db, {"a": "admin"})
    for public, want in ((False, 401), (True, 200)):
        app = create_app(Settings(metrics_public=public, database_url=fresh_db), database_url=fresh_db)
        with TestClient(app) as c:
            assert c.get("/metrics").status_code == want
            assert c.get("/v1/summary").status_code == 401


def test_require_auth_closes_a_service_with_no_keys(fresh_db: str) -> None:
    from service.settings import Settings

    app = create_app(Settings(require_auth=True, database_url=fresh_db), database_url=fresh_db)
    with TestClient(app) as c:
        assert c.get("/v1/policy").status_code == 401
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize("param", ["base_url", "api_key_env", "url", "timeout_s"])
def test_spec_with_a_raw_judge_url_or_key_variable_is_refused(client: TestClient, param: str) -> None:
    params = {"endpoint": "x", "model": "m", param: "DATABASE_URL"}
    body = {"name": "j", "components": [{"name": "judge", "kind": "judge.llm", "params": params}]}
    r = client.post("/v1/reward-specs", json=body)
    assert r.status_code == 422 and param in r.json()["error"], r.text
    assert client.get("/v1/reward-specs/j").status_code == 404


def test_spec_naming_an_unconfigured_judge_endpoint_is_refused(client: TestClient) -> None:
    body = {"name": "j2", "components": [{"name": "judge", "kind": "judge.llm", "params": {"endpoint": "nope", "model": "m"}}]}
    r = client.post("/v1/reward-specs", json=body)
    assert r.status_code == 422 and r.json()["error"].startswith("components[0].params.endpoint: unknown judge endpoint")
    assert client.get("/v1/reward-specs/j2").status_code == 404


def test_a_token_in_the_path_authenticates_and_is_redacted_in_access_logs(client: TestClient, tokens) -> None:
    """For clients that cannot send headers (OpenRLHF's reward URL): ``allow(..., token_param=...)``."""
    import logging

    from service.auth.service import PRODUCER, RedactTokens, allow, redact

    router = APIRouter()

    @router.get("/compat/test/{key}/ping", dependencies=[allow(PRODUCER, token_param="key")])
    def ping() -> dict[str, str]:
        return {"ok": "yes"}

    client.app.include_router(router)  # type: ignore[attr-defined]
    assert client.get(f"/compat/test/{tokens['producer']}/ping").status_code == 200
    assert client.get(f"/compat/test/{tokens['revoked']}/ping").status_code == 401
    assert client.get(f"/compat/test/{tokens['viewer']}/ping").status_code == 403
    assert client.get("/compat/test/nothing/ping").status_code == 401
    token = tokens["producer"]
    record = logging.LogRecord("uvicorn.access", 20, "", 0, '%s - "%s %s"', ("1.2.3.4", "GET", f"/compat/test/{token}/ping"), None)
    RedactTokens().filter(record)
    assert secret_of(token) not in record.getMessage() and "_***" in record.getMessage()
    assert redact("no token here") == "no token here"


def test_scoped_viewer_reads_only_its_datasets(client: TestClient, session: Session) -> None:
    token = keys.create_key(session, "v-a", "viewer", ["ds-a"])
    admin = {"Authorization": f"Bearer {keys.create_key(session, 'adm', 'admin')}"}
    session.commit()
    h = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/stats?dataset=ds-a", headers=h).status_code == 200
    assert client.get("/v1/stats", headers=h).status_code == 403  # must name a dataset
    assert client.get("/v1/stats?dataset=ds-b", headers=h).status_code == 403
    assert client.get("/v1/stats?dataset=ds-a&dataset=ds-b", headers=h).status_code == 403  # repeated
    assert client.get("/v1/groups?dataset=ds-a", headers=h).status_code == 200
    assert client.get("/v1/summary", headers=h).status_code == 403  # spans every dataset
    assert client.get("/v1/summary?dataset=ds-b", headers=h).status_code == 403
    assert client.post("/v1/groups", json=make_group("v-1", prompt_id="vp", dataset="ds-b"), headers=admin).status_code == 201
    assert client.post("/v1/groups", json=make_group("v-2", prompt_id="vq", dataset="ds-a"), headers=admin).status_code == 201
    r = client.get("/v1/groups/v-1", headers=h)  # another dataset's group: exactly like an unknown id
    assert r.status_code == 404 and "ds-b" not in r.text
    assert client.get("/v1/summary?dataset=ds-a", headers=h).json()["groups"] == {"received": 1}  # its own only
    assert sum(client.get("/v1/summary", headers=admin).json()["groups"].values()) == 2


# Attack: FastAPI's own /openapi.json and /redoc were open with auth on (not APIRoutes, so unchecked).
@pytest.mark.parametrize(("path", "want"), [("/openapi.json", 401), ("/redoc", 404), ("/docs", 200)])
def test_with_auth_on_only_healthz_is_open(client: TestClient, admin, path: str, want: int) -> None:
    """Issue: once a key exists, every route except /healthz requires a key. FastAPI's own routes
    (the full API schema and the docs UI) were not APIRoutes, so check_routes never saw them.
    Fixed: /openapi.json is a declared route (any key); /redoc does not exist; /docs stays a public HTML
    shell by design (docs/security.md) that holds no schema and fetches /openapi.json with the stored key."""
    assert client.get("/v1/stats").status_code == 401  # auth is on
    r = client.get(path)
    assert r.status_code == want, (r.status_code, r.text[:200])
    if path == "/docs":
        assert "/v1/groups" not in r.text and "GroupIn" not in r.text  # the shell only, no schema
    if path == "/openapi.json":
        doc = client.get(path, headers=admin).json()
        assert "/v1/groups" in doc["paths"]


# Attack: a dataset-scoped key probing ids learned which groups / prompts / datasets exist elsewhere.
def test_a_scoped_key_cannot_enumerate_other_datasets(client: TestClient, session: Session, admin) -> None:
    """A key scoped to ds-a probing ids learns which groups / prompts exist in other datasets and the
    names of those datasets: an out-of-scope id is a 403 naming its dataset, an unknown one a 404/422."""
    viewer = bearer(keys.create_key(session, "atk-viewer-a", "viewer", ["ds-a"]))
    producer = bearer(keys.create_key(session, "atk-producer-a", "producer", ["ds-a"]))
    session.commit()
    from tests.helpers import make_group

    secret = make_group("secret-g", prompt_id="secret-p", dataset="secret-project-x")
    assert client.post("/v1/groups", json=secret, headers=admin).status_code == 201
    hidden = client.get("/v1/groups/secret-g", headers=viewer)
    unknown = client.get("/v1/groups/no-such-group", headers=viewer)
    assert "secret-project-x" not in hidden.text, hidden.text
    assert hidden.status_code == unknown.status_code, (hidden.status_code, unknown.status_code)
    probe = make_group("probe-1", prompt_id="secret-p", inline_prompt=False)
    ghost = make_group("probe-2", prompt_id="no-such-prompt", inline_prompt=False)
    hidden = client.post("/v1/groups", json=probe, headers=producer)
    unknown = client.post("/v1/groups", json=ghost, headers=producer)
    assert "secret-project-x" not in hidden.text, hidden.text
    assert hidden.status_code == unknown.status_code, (hidden.status_code, unknown.status_code)
    # an inline prompt reusing the id: no field-by-field answer (an oracle on the stored reference)
    answers = []
    for i, guess in enumerate(["42", "41"]):  # the right and a wrong guess of the reference answer
        g = make_group(f"probe-{3 + i}", prompt_id="secret-p", dataset="ds-a", reference={"answer": guess})
        r = client.post("/v1/groups", json=g, headers=producer)
        assert r.status_code == 409 and "secret-project-x" not in r.text and "reference" not in r.text, r.text
        answers.append(r.json()["error"])
    assert answers[0] == answers[1]
    assert client.get("/v1/groups/probe-3", headers=admin).status_code == 404  # nothing stored

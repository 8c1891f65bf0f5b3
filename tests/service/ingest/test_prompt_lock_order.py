"""One lock order for prompt rows. Curation's outcome update locks prompts FOR UPDATE in id order; an
ingest of groups takes KEY SHARE locks on their prompts (the foreign-key checks). Before, the ingest took
them in request order: holding prompt B while waiting for A, which the worker held while it waited for B
-> DeadlockDetected "while locking tuple ... in relation prompts" (seen in the demo's log). The colliding
paths run concurrently here, in the interleaving that deadlocked."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.curation import repository as curate_repo
from service.ingest import prompts_repository as prompts_repo
from tests.helpers import make_group


def _wait_until_blocked(api, what: str, timeout_s: float = 30) -> None:
    """Until some backend waits on a lock (the ingest request queued behind the worker's row lock)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with api.factory() as s:
            if s.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                             " AND datname = current_database()")):
                return
        time.sleep(0.05)
    raise AssertionError(f"{what} never waited on a lock")


def _post_prompts(api, ids: list[str]) -> None:
    prompts = [{"id": pid, "dataset": "toy", "messages": [{"role": "user", "content": f"q {pid}"}],
                "reference": {"answer": "42"}} for pid in ids]
    assert api.post("/v1/prompts", json={"prompts": prompts}).status_code == 200


def test_ingest_and_outcome_update_lock_prompts_in_one_order(api):
    _post_prompts(api, ["lock-a", "lock-b"])
    # the batch names prompt b before a: in request order its FK checks would hold b while waiting for a
    body = {"groups": [make_group("g-b", prompt_id="lock-b", inline_prompt=False),
                       make_group("g-a", prompt_id="lock-a", inline_prompt=False)]}
    answer: dict = {}
    with api.factory() as worker:
        worker.begin()
        curate_repo.record_outcomes(worker, [("lock-a", 0.5)])  # the worker holds prompt a ...
        ingest = threading.Thread(target=lambda: answer.update(r=api.post("/v1/groups", json=body)))
        ingest.start()
        _wait_until_blocked(api, "the ingest")
        curate_repo.record_outcomes(worker, [("lock-b", 0.25)])  # ... and now wants b
        worker.commit()
    ingest.join(timeout=60)
    assert answer["r"].status_code in (200, 201), answer["r"].text
    assert [g["status"] for g in answer["r"].json()["groups"]] == ["received", "received"]
    with api.factory() as s:
        assert dict(s.execute(text("SELECT id, n_groups FROM prompts ORDER BY id")).all()) == {"lock-a": 1, "lock-b": 1}


def test_prompt_upserts_in_opposite_orders_never_deadlock(api):
    """Two admins' POST /v1/prompts with the same prompts in opposite orders, many times at once."""
    ids = [f"up-{i:02d}" for i in range(20)]
    _post_prompts(api, ids)
    failures: list[str] = []

    def upsert(order: list[str], n: int) -> None:
        for k in range(n):
            prompts = [{"id": pid, "dataset": "toy", "messages": [{"role": "user", "content": f"q {pid} {k}"}],
                        "reference": {"answer": str(k)}} for pid in order]
            r = api.post("/v1/prompts", json={"prompts": prompts})
            if r.status_code != 200:
                failures.append(r.text)

    threads = [threading.Thread(target=upsert, args=(order, 15)) for order in (ids, ids[::-1], ids, ids[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == []


# -- under a non-C collation -------------------------------------------------------------------------------
# Ingest sorts prompt rows in Python (code point order); the locking SELECTs order in SQL. Under en_US / ICU
# -- docker-compose's postgres default -- the database's own order differs: 'a' < 'a_1' < 'a-2' < 'A1' < 'B'
# there, 'A1' < 'B' < 'a' < 'a-2' < 'a_1' in Python. Every lock-ordering ORDER BY says COLLATE "C".
ICU_IDS = ["a", "B", "a-2", "a_1", "A1", "é", "z"]


def _icu_locale(server_url: str) -> str | None:
    from sqlalchemy import create_engine

    eng = create_engine(server_url)
    try:
        with eng.connect() as c:
            if c.scalar(text("SELECT count(*) FROM pg_collation WHERE collname = 'en-US-x-icu'")):
                return "ICU_LOCALE"
            if c.scalar(text("SELECT count(*) FROM pg_collation WHERE collname IN ('en_US.utf8', 'en_US.UTF-8')")):
                return "LC_COLLATE"
    finally:
        eng.dispose()
    return None


@pytest.fixture
def icu_api(server_url: str):
    """``committing_client`` over a migrated database whose default collation is en-US (ICU, else libc)."""
    import uuid

    from sqlalchemy import create_engine

    from service.store.dbadmin import drop_database
    from service.store.migrate import upgrade
    from tests.conftest import committing_client

    how = _icu_locale(server_url)
    if how is None:
        pytest.skip("the server has neither an ICU nor an en_US collation")
    name = f"gct_icu_{uuid.uuid4().hex[:12]}"
    locale = ("LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'" if how == "ICU_LOCALE"
              else "LC_COLLATE 'en_US.utf8' LC_CTYPE 'en_US.utf8'")
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE template0 ENCODING \'UTF8\' {locale}'))
    admin.dispose()
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        with committing_client(url) as c:
            with c.factory() as s:  # the premise: this database's default order is not Python's
                db_order = list(s.scalars(text("SELECT x FROM unnest(CAST(:ids AS text[])) x ORDER BY x"),
                                          {"ids": ICU_IDS}))
            assert db_order != sorted(ICU_IDS), db_order
            yield c
    finally:
        from service.store.db import dispose_engine

        dispose_engine(url)
        drop_database(server_url, url)


def test_key_share_lock_takes_prompts_in_python_order_under_icu(icu_api):
    _post_prompts(icu_api, ICU_IDS)
    with icu_api.factory() as s, s.begin():
        locked = prompts_repo.lock_prompts_for_groups(s, ICU_IDS[::-1])
    assert list(locked) == sorted(ICU_IDS)  # rows come back (and are locked) in the order of the SELECT


def _lock_waiters(api) -> int:
    with api.factory() as s:
        return s.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                             " AND datname = current_database()"))


@pytest.mark.parametrize("outcome_path", ["record", "retract"])
def test_upsert_and_outcome_update_collide_without_deadlock_under_icu(icu_api, outcome_path: str):
    """The interleaving that deadlocked: a blocker holds the first prompt in Python order; an admin's upsert
    (rows sorted in Python) queues on it holding nothing; the worker's outcome update, ordering in the
    database's collation, locked the other prompt first and queued on the blocker's too. When the blocker
    commits, the upsert gets 'A1', wants 'a', which the worker held -> DeadlockDetected. In one order, the
    worker queues on 'A1' holding nothing and both finish."""
    ids = ["A1", "a"]  # Python: 'A1' < 'a'; en-US: 'a' < 'A1'
    _post_prompts(icu_api, ids)
    answers: dict = {}
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with icu_api.factory() as s, s.begin():
                rows = [(pid, 0.5) for pid in ids]
                if outcome_path == "record":
                    curate_repo.record_outcomes(s, rows)
                else:
                    curate_repo.retract_outcomes(s, rows)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with icu_api.factory() as blocker:
        blocker.begin()
        blocker.execute(text("SELECT id FROM prompts WHERE id = 'A1' FOR UPDATE"))
        prompts = [{"id": pid, "dataset": "toy", "messages": [{"role": "user", "content": f"new {pid}"}],
                    "reference": {"answer": "7"}} for pid in ids]
        upsert = threading.Thread(target=lambda: answers.update(
            r=icu_api.post("/v1/prompts", json={"prompts": prompts})))
        upsert.start()
        _wait_until_blocked(icu_api, "the upsert")
        outcome = threading.Thread(target=worker)
        outcome.start()
        deadline = time.monotonic() + 30
        while _lock_waiters(icu_api) < 2:
            assert time.monotonic() < deadline, "the outcome update never waited on a lock"
            time.sleep(0.05)
        blocker.commit()
    upsert.join(timeout=60)
    outcome.join(timeout=60)
    assert errors == [], errors
    assert answers["r"].status_code == 200, answers["r"].text
    with icu_api.factory() as s:
        rows = dict(s.execute(text("SELECT id, messages->0->>'content' FROM prompts")).all())
    assert rows == {"A1": "new A1", "a": "new a"}

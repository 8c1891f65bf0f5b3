"""Attack findings against issue 16 items 2-5 (availability work on branch i16b).

Each test fails on the code as reviewed and should pass once the finding is fixed:

1. Lost wake-up: a long poll whose token/trajectory budget is smaller than the ready group is treated
   as "unfiltered" by the ReadyHub. Its empty attempt ends the wake-up chain and marks "nothing ready",
   so a fresh poll that could take the group skips its query and waits to its deadline (204) while the
   group sits ready.
2. RE2 answers differently from ``re`` on patterns classified "linear": ``{,n}``, POSIX classes
   ``[[:alpha:]]``, captures of a repeated group. A spec's reward changes with the engine.
3. "Linear" is not "bounded": an RE2 pattern with many wide counted repeats runs for tens of seconds
   on a few thousand characters, inline in the worker, with no deadline (never ``verification_timeout``).
4. ``verifier.json_schema``: a wrong answer with a >4300-digit integer or deep nesting makes the
   component raise -> error (could not score, the group is dropped) instead of a fail (0).
"""

from __future__ import annotations

import random
import re
import threading
import time

import httpx
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from reward_models import RewardSpec, Scorer
from reward_models.patterns import UserPattern
from service.auth import keys
from tests.conftest import start_server, stop_server
from tests.helpers import make_group
from tests.reward_models.helpers import make_prompt, make_sample
from tests.service.delivery.helpers import mark_ready

# ---------------------------------------------------------------------------------------------------
# 1. lost wake-ups: a budget that skips a group is treated as "nothing is ready"


def _lease(url: str, body: dict, out: dict, key: str) -> None:
    with httpx.Client(base_url=url, timeout=90) as http:
        start = time.monotonic()
        out[key] = http.post("/v1/batches/lease", json=body)
        out[key + "_s"] = time.monotonic() - start


def test_a_ready_group_reaches_a_fresh_poll_even_after_a_small_budget_poll_found_it_too_big(make_db):
    """Group ready before anyone polls. Two pollers with max_tokens=1 (the group alone is over their
    budget: skipped) wait; then a poll that CAN take the group arrives. It must get it, not a 204."""
    server = start_server(make_db(), env={"GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30"})
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.post("/v1/groups", json=make_group("big-0", n=2)).status_code == 201
        engine = create_engine(server.db_url)
        mark_ready(engine, ["big-0"])
        engine.dispose()
        out: dict = {}
        tiny = {"max_tokens": 1, "wait_seconds": 20}
        threads = []
        for i in range(2):
            t = threading.Thread(target=_lease, args=(server.url, {"trainer_id": f"tiny{i}", **tiny}, out, f"tiny{i}"))
            t.start()
            threads.append(t)
            time.sleep(1.0)  # the first starts the listener; the second's empty attempt marks "nothing ready"
        _lease(server.url, {"trainer_id": "real", "max_groups": 1, "wait_seconds": 5}, out, "real")
        for t in threads:
            t.join()
    finally:
        stop_server(server)
    _delivered_once(out, "big-0")


def _delivered_once(out: dict, group_id: str) -> None:
    """The group reached exactly one poll. (A first group over a poll's budget is delivered alone, so a
    small-budget poll may be the one that takes it; what must not happen is every poll getting 204.)"""
    got = {k: v for k, v in out.items() if not k.endswith("_s") and v.status_code == 200}
    codes = {k: v.status_code for k, v in out.items() if not k.endswith("_s")}
    assert len(got) == 1, f"a ready group was delivered to {len(got)} polls: {codes}"
    (batch,) = got.values()
    assert [g["id"] for g in batch.json()["groups"]] == [group_id]


def test_a_notification_reaches_a_waiter_that_can_take_the_group_behind_small_budget_waiters(make_db):
    """Waiters: max_tokens=1 first, then one that can take the group. The group becomes ready (NOTIFY):
    the wake-up goes to the small one, which skips the group and ends the chain; the real waiter sleeps."""
    server = start_server(make_db(), env={"GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30"})
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.post("/v1/groups", json=make_group("big-1", n=2)).status_code == 201
        out: dict = {}
        tiny = threading.Thread(
            target=_lease, args=(server.url, {"trainer_id": "tiny", "max_tokens": 1, "wait_seconds": 15}, out, "tiny")
        )
        tiny.start()
        time.sleep(1.0)
        real = threading.Thread(
            target=_lease, args=(server.url, {"trainer_id": "real", "max_groups": 1, "wait_seconds": 8}, out, "real")
        )
        real.start()
        time.sleep(1.0)
        engine = create_engine(server.db_url)
        mark_ready(engine, ["big-1"])  # the trigger notifies: one wake-up
        engine.dispose()
        real.join()
        tiny.join()
    finally:
        stop_server(server)
    _delivered_once(out, "big-1")


# 1b. the same lost wake-up through a filter the poll's body does not show: a dataset-scoped key


def _scoped_server(make_db) -> tuple:
    db = make_db()
    server = start_server(db, env={"GRPO_CURATOR_LEASE_WAIT_CHECK_S": "30"})
    tokens = keys.provision(db, {"p": "producer", "t": "trainer"})
    with Session(create_engine(db)) as s, s.begin():
        tokens["scoped"] = keys.create_key(s, "scoped", "trainer", ["elsewhere"])
    return server, tokens


def _lease_as(url: str, token: str, body: dict, out: dict, name: str) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=url, timeout=90, headers={"Authorization": f"Bearer {token}"}) as http:
            start = time.monotonic()
            out[name] = http.post("/v1/batches/lease", json=body)
            out[name + "_s"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_scoped_keys_empty_poll_does_not_mark_nothing_ready(make_db) -> None:
    """A ready group in dataset 'toy'; a poll with a key scoped to another dataset finds nothing and
    waits. A fresh poll with an unscoped key must still query (and lease), not trust 'nothing ready'."""
    server, tokens = _scoped_server(make_db)
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {tokens['p']}"}) as http:
            assert http.post("/v1/groups", json=make_group("toy-0", n=2)).status_code == 201
        engine = create_engine(server.db_url)
        mark_ready(engine, ["toy-0"])
        engine.dispose()
        out: dict = {}
        scoped = []
        for i in range(2):  # the first starts the listener; the second's empty attempt is the one judged
            body = {"trainer_id": f"s{i}", "max_groups": 1, "wait_seconds": 8}
            scoped.append(_lease_as(server.url, tokens["scoped"], body, out, f"scoped{i}"))
            time.sleep(1.0)
        _lease_as(server.url, tokens["t"], {"trainer_id": "real", "max_groups": 1, "wait_seconds": 5}, out, "real").join()
        for t in scoped:
            t.join()
    finally:
        stop_server(server)
    assert out["scoped0"].status_code == out["scoped1"].status_code == 204
    assert out["real"].status_code == 200, f"ready group not delivered: {out['real'].status_code} after {out['real_s']:.1f}s"


def test_a_notification_goes_past_a_scoped_waiter_to_one_that_can_lease(make_db) -> None:
    """Waiters: a dataset-scoped one first, then an unscoped one. The group becomes ready (one NOTIFY):
    the scoped waiter sees nothing and must pass the wake-up on."""
    server, tokens = _scoped_server(make_db)
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {tokens['p']}"}) as http:
            assert http.post("/v1/groups", json=make_group("toy-1", n=2)).status_code == 201
        out: dict = {}
        scoped = _lease_as(server.url, tokens["scoped"], {"trainer_id": "s", "max_groups": 1, "wait_seconds": 12}, out, "scoped")
        time.sleep(1.0)
        real = _lease_as(server.url, tokens["t"], {"trainer_id": "real", "max_groups": 1, "wait_seconds": 8}, out, "real")
        time.sleep(1.0)
        engine = create_engine(server.db_url)
        mark_ready(engine, ["toy-1"])
        engine.dispose()
        real.join()
        scoped.join()
    finally:
        stop_server(server)
    assert out["real"].status_code == 200, f"the waiter that could lease got {out['real'].status_code} after {out['real_s']:.1f}s"
    assert out["real_s"] < 7.0  # woken by the notification's chain, not by the end of its own wait


# ---------------------------------------------------------------------------------------------------
# 2. RE2 reads some "linear" patterns differently from re: the reward depends on the engine


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"<answer>[0-9]{,3}</answer>", "<answer>42</answer>"),  # re: {0,3}; RE2: the literal '{,3}'
        (r"[[:alpha:]]+", "abc"),  # RE2: POSIX class; re: the set '[:alph' then a literal ']'
        (r"[[:alpha:]]", "a]"),
        (r"(?P<answer>a*)*", "aa"),  # captures of a repeated group: re '' vs RE2 'aa'
    ],
)
def test_a_pattern_classified_linear_answers_exactly_as_re(pattern: str, text: str) -> None:
    ours, ref = UserPattern(pattern), re.compile(pattern, re.DOTALL)
    got, want = ours.fullmatch(text), ref.fullmatch(text)
    as_tuple = lambda m: None if m is None else (m.group(0), m.groups())  # noqa: E731
    assert as_tuple(got) == as_tuple(want), f"linear={ours.linear}: RE2 {as_tuple(got)} vs re {as_tuple(want)}"


def test_format_reward_is_the_same_as_with_re_for_a_bounded_repeat() -> None:
    """The reward a spec author gets for the documented (re) reading of ``{,3}``."""
    spec = RewardSpec(
        name="fmt",
        components=[{"name": "fmt", "kind": "rule.format", "outcome": True,
                     "params": {"pattern": r"<answer>[0-9]{,3}</answer>", "match": "fullmatch"}}],
    )
    with Scorer(processes=1, timeout_s=5.0) as scorer:
        (scored,) = scorer.score(spec, [(make_sample("<answer>42</answer>"), make_prompt())])
    assert scored.components["fmt"].value == 1.0


# ---------------------------------------------------------------------------------------------------
# 3. an RE2 ("linear") pattern is still unbounded in practice and runs with no deadline

WIDE = "(?:" + "|".join(f"[a-q][^u-z]{{0,999}}{chr(0x4E00 + i)}" for i in range(50)) + ")+!"


def test_a_linear_pattern_that_is_slow_in_practice_is_still_held_to_the_component_deadline() -> None:
    rule = UserPattern(WIDE)
    assert rule.linear  # accepted by RE2: scored inline, outside the pool
    random.seed(0)
    text = "".join(random.choice("ar") for _ in range(3000))
    spec = RewardSpec(
        name="wide",
        components=[{"name": "fmt", "kind": "rule.format", "outcome": True, "params": {"pattern": WIDE}}],
    )
    with Scorer(processes=1, timeout_s=2.0) as scorer:
        start = time.perf_counter()
        (scored,) = scorer.score(spec, [(make_sample(text), make_prompt())])
        elapsed = time.perf_counter() - start
    # with a 2 s deadline (plus a canary) scoring must end within a few seconds, as a fail
    assert elapsed < 8.0, f"one 3000-char answer held the scorer {elapsed:.1f}s with no deadline"
    assert scored.components["fmt"].value == 0.0


# ---------------------------------------------------------------------------------------------------
# 4. json_schema: a wrong answer can make the verifier raise (error = could not score = group dropped)

SCHEMA_SPEC = RewardSpec(
    name="schema",
    components=[{"name": "valid", "kind": "verifier.json_schema", "outcome": True,
                 "params": {"schema": {"type": "object", "required": ["a"]}, "extract": "whole"}}],
)


@pytest.mark.parametrize(
    "answer",
    ['{"b": ' + "9" * 5000 + "}", "[" * 100000 + "]" * 100000, '{"a": NaN}', '{"a": -Infinity}', "NaN"],
    ids=["int-over-4300-digits", "nested-100k", "nan", "minus-infinity", "bare-nan"],
)
def test_a_wrong_json_answer_is_a_fail_not_an_error(answer: str) -> None:
    with Scorer(processes=1, timeout_s=5.0) as scorer:
        (scored,) = scorer.score(SCHEMA_SPEC, [(make_sample(answer), make_prompt({}))])
    result = scored.components["valid"]
    assert result.error is None, f"the answer turned its own fail into 'could not score': {result.error}"
    assert result.value == 0.0 and result.details["reason"] == "not_json"


@pytest.mark.parametrize("answer", ['{"x": NaN}', '{"x": Infinity}', '{"x": 5}'])
def test_nan_never_passes_a_bound(answer: str) -> None:
    """NaN compares false to everything, so it would pass ``minimum``/``maximum``; it is not JSON."""
    schema = {"type": "object", "required": ["x"], "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}}}
    spec = RewardSpec(name="bound", components=[{"name": "v", "kind": "verifier.json_schema", "outcome": True,
                                                 "params": {"schema": schema, "extract": "whole"}}])
    with Scorer(processes=1, timeout_s=5.0) as scorer:
        (scored,) = scorer.score(spec, [(make_sample(answer), make_prompt({}))])
    assert scored.components["v"].error is None and scored.components["v"].value == 0.0

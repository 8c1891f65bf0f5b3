"""The real OpenRLHF 0.8 (installed --no-deps): its own remote-RM request function against the live service,
and its own ``update_samples_with_rewards`` (the code that ``torch.cat``s ``extra_logs``) on what it got."""

from __future__ import annotations

import ast
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from grpo_curator_integrations import openrlhf as ours
from grpo_curator_integrations._http import ScoringError
from service.auth import keys
from service.store.db import get_engine, make_sessionmaker
from tests.conftest import LiveServer, start_server, stop_server
from tests.integrations.conftest import SPEC, skip_unless_installed

skip_unless_installed(torch="OpenRLHF's reward path builds torch tensors (make install-dev installs torch)",
                      ray="OpenRLHF imports ray at module load (the upstream extra of make install-dev)",
                      openrlhf="the upstream OpenRLHF these tests run (make install-dev, or pip install --no-deps openrlhf==0.8.11)")
import torch  # noqa: E402 (every worker imports it anyway)


def remote_rm():
    """OpenRLHF's remote reward module (imported when a test uses it: with it come ray and torch)."""
    import openrlhf.utils.remote_rm_utils

    return openrlhf.utils.remote_rm_utils


GOOD = "<answer>42</answer>"
PROMPT = "<s>[INST] 6*7? [/INST]"


def update_samples_with_rewards():
    """OpenRLHF's own function, compiled from its installed file (the module imports deepspeed, which is
    not installed here; the function itself needs only torch)."""
    import openrlhf

    path = f"{openrlhf.__path__[0]}/trainer/ppo_utils/experience_maker.py"
    tree = ast.parse(open(path).read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "update_samples_with_rewards")
    scope: dict = {"torch": torch}
    exec(compile(ast.Module([fn], []), path, "exec"), scope)
    return scope["update_samples_with_rewards"]


def samples(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(sequences=torch.zeros(n, 4), info={})]


@pytest.fixture(scope="module")
def keyed(make_db) -> Iterator[tuple[LiveServer, str, str]]:
    """A service set up the way docs/integrations.md says for OpenRLHF 0.8: extra_logs omitted, value mode,
    keys on (an admin key for setup, a trainer key for OpenRLHF)."""
    db = make_db()
    with make_sessionmaker(get_engine(db)).begin() as s:
        admin, trainer = keys.create_key(s, "ops", "admin"), keys.create_key(s, "rl", "trainer")
    server = start_server(db, env={"GRPO_CURATOR_OPENRLHF_EXTRA_LOGS": "omit",
                                   "GRPO_CURATOR_OPENRLHF_ON_ERROR": "value"})
    try:
        assert httpx.post(f"{server.url}/v1/reward-specs", json=SPEC,
                          headers={"authorization": f"Bearer {admin}"}).status_code == 201
        yield server, admin, trainer
    finally:
        stop_server(server)


def body(responses: list[str], labels: list) -> dict:
    return {"query": [PROMPT + r + "</s>" for r in responses], "prompts": [PROMPT] * len(responses), "labels": labels}


def test_openrlhf_08_breaks_on_json_lists_and_takes_the_omitted_form(service: LiveServer, keyed) -> None:
    update = update_samples_with_rewards()
    lists = remote_rm().request_api_wrapper(f"{service.url}/compat/openrlhf/integ/get_reward", body([GOOD, "42"], ["42", "42"]))
    assert lists["extra_logs"]["fmt"] == [1.0, 0.0]
    with pytest.raises(TypeError, match="Tensor"):  # the 0.8 failure the default (0.11) form causes
        update([lists], samples(2))
    server, _, trainer = keyed
    url = f"{server.url}/compat/openrlhf/key/{trainer}/integ/get_reward"
    omitted = remote_rm().request_api_wrapper(url, body([GOOD, "42"], ["42", "42"]))
    assert "extra_logs" not in omitted and omitted["rewards"] == [1.5, 1.0]
    [got] = update([omitted], samples(2))
    assert got.rewards.tolist() == [1.5, 1.0] and got.info["reward"].tolist() == [1.5, 1.0]


def test_openrlhf_header_key_and_the_path_key_in_its_log(keyed) -> None:
    server, _, trainer = keyed
    route = f"{server.url}/compat/openrlhf/integ/get_reward"
    assert httpx.post(route, json=body([GOOD], ["42"])).status_code == 401
    ok = httpx.post(route, json=body([GOOD], ["42"]), headers={"authorization": f"Bearer {trainer}"})
    assert ok.status_code == 200 and ok.json()["rewards"] == [1.5]
    # OpenRLHF retries every failure, 4xx included, and logs the URL: with the key in the path, the key
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    remote_rm().logger.addHandler(handler)
    try:
        with pytest.raises(Exception, match="Request error for 2 times"):
            remote_rm().request_api_wrapper(f"{server.url}/compat/openrlhf/key/{trainer}/integ/get_reward",
                                          {"query": ["x"], "prompts": [PROMPT], "labels": ["42"]}, try_max_times=2)
    finally:
        remote_rm().logger.removeHandler(handler)
    assert len(records) == 2 and all("422" in r and trainer in r for r in records)


def test_openrlhf_reward_func_stops_on_an_unscorable_item(service: LiveServer, keyed,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    q = [PROMPT + r + "</s>" for r in (GOOD, GOOD)]
    with pytest.raises(ScoringError, match=r"503 query\[1\]: could not be scored"):  # fail mode: the reason
        ours.reward_func(q, [PROMPT] * 2, ["42", None], url=service.url, spec="integ")
    server, _, trainer = keyed
    monkeypatch.setenv("GRPO_CURATOR_API_KEY", trainer)
    kw = {"url": server.url, "spec": "integ"}
    # the documented 0.8 setup (value mode, extra_logs omitted): the service still says which item it
    # substituted, in a top-level key OpenRLHF ignores, and the file stops the run naming it
    with pytest.raises(ScoringError, match=r"query\[1\]: could not be scored \(1 of 2"):
        ours.reward_func(q, [PROMPT] * 2, ["42", None], **kw)
    with pytest.raises(ScoringError, match=r"query\[2\]: could not be scored"):  # the index in the whole call
        ours.reward_func(q + q, [PROMPT] * 4, ["42", "42", None, "42"], **kw)
    out = ours.reward_func(q, [PROMPT] * 2, ["42", None], on_error="value", **kw)
    assert out["rewards"].tolist() == [1.5, 0.0]  # the service's substitute, flagged although no logs came back
    assert out["extra_logs"]["reward_error"].tolist() == [0.0, 1.0]
    raw = httpx.post(f"{server.url}/compat/openrlhf/integ/get_reward", json=body([GOOD, GOOD], ["42", None]),
                     headers={"authorization": f"Bearer {trainer}"}).json()
    assert "extra_logs" not in raw and raw["substituted"] == [1]
    [got] = update_samples_with_rewards()([raw], samples(2))  # OpenRLHF 0.8 ignores the extra key
    assert got.rewards.tolist() == [1.5, 0.0]
    [got] = update_samples_with_rewards()([out], samples(2))
    assert got.rewards.tolist() == [1.5, 0.0]


def test_openrlhf_08_loads_the_reward_function_file(service: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """0.8's own loader (``RemoteRewardModel.__init__``, compiled from its file with ``ray.remote`` as the
    identity: no Ray cluster here) takes grpo_curator_integrations/openrlhf.py by path; what it loaded
    scores through the service and returns tensors."""
    from pathlib import Path

    tree = ast.parse(open(remote_rm().__file__).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RemoteRewardModel")
    scope: dict = {"ray": SimpleNamespace(remote=lambda f: f)}
    exec(compile(ast.Module([cls], []), remote_rm().__file__, "exec"), scope)
    path = Path(ours.__file__).resolve()
    model = scope["RemoteRewardModel"](SimpleNamespace(micro_rollout_batch_size=2), str(path))
    monkeypatch.setenv("GRPO_CURATOR_URL", service.url)
    monkeypatch.setenv("GRPO_CURATOR_REWARD_SPEC", "integ")
    out = model.custom_reward_func([PROMPT + GOOD + "</s>"], [PROMPT], ["42"])
    assert out["rewards"].tolist() == [1.5] and out["extra_logs"]["fmt"].tolist() == [1.0]

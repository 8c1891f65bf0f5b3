"""TRL's ``reward_funcs`` reads the reward spec first; a dataset-scoped key may not read specs (a spec spans
every dataset), so it fails with the 403 docs/integrations.md quotes, before any training starts."""

from __future__ import annotations

import httpx
import pytest

from grpo_curator_integrations import trl
from grpo_curator_integrations._http import ScoringError
from tests.conftest import start_server, stop_server
from tests.integrations.conftest import SPEC


def test_a_dataset_scoped_key_cannot_read_the_spec(make_db) -> None:
    from service.auth.keys import create_key
    from service.store.db import get_engine, make_sessionmaker

    db = make_db()
    with make_sessionmaker(get_engine(db)).begin() as session:
        admin = create_key(session, "admin", "admin", None)
        scoped = create_key(session, "trl-gsm8k", "trainer", ["gsm8k"])
        whole = create_key(session, "trl-all", "trainer", None)
    server = start_server(db)
    try:
        r = httpx.post(f"{server.url}/v1/reward-specs", json=SPEC, headers={"authorization": f"Bearer {admin}"})
        assert r.status_code == 201, r.text
        with pytest.raises(ScoringError) as err:
            trl.reward_funcs(spec="integ", url=server.url, api_key=scoped)
        assert err.value.status == 403
        assert str(err.value) == ("GET /v1/reward-specs/integ: 403 authorization: key 'trl-gsm8k' is scoped to "
                                  "datasets; this route spans every dataset")
        funcs, weights = trl.reward_funcs(spec="integ", url=server.url, api_key=whole)  # the documented way out
        assert weights == [1.0, 0.5] and len(funcs) == 2
    finally:
        stop_server(server)

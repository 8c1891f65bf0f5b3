"""The trainer continues from the service's latest policy version, which a trainer key may only step by one.

A checkpoint ahead of the service (the service was reset) used to make the trainer publish checkpoint + 1,
which the service now refuses for trainer keys (409, expected latest + 1): it continues from the service's
latest + 1 instead, and logs that it did.
"""

from __future__ import annotations

import logging

from service.auth import keys
from service.client import CuratorClient
from service.store.db import get_engine, make_sessionmaker
from trainer.delivery import next_version, publish_version


def _trainer_client(live_server) -> CuratorClient:
    """A trainer key on the live service (auth on once a key exists), the service at version 3."""
    with make_sessionmaker(get_engine(live_server.db_url)).begin() as session:
        token = keys.create_key(session, "trainer-next", "trainer")
    client = CuratorClient(live_server.url, api_key=token)
    for v in (1, 2, 3):
        publish_version(client, v, {})
    return client


def test_a_checkpoint_ahead_of_the_service_continues_from_the_services_latest(live_server, caplog) -> None:
    client = _trainer_client(live_server)
    with caplog.at_level(logging.WARNING, logger="trainer.delivery"):
        version = next_version(client, checkpoint_version=12)
    assert version == 3
    assert "ahead of the service's 3" in caplog.text and "publishing 4 next" in caplog.text
    publish_version(client, version + 1, {"loss": 1.0})  # the service accepts what the trainer publishes next
    assert client.get_policy()["version"] == 4


def test_a_service_ahead_of_the_checkpoint_is_continued_from(live_server, caplog) -> None:
    client = _trainer_client(live_server)
    with caplog.at_level(logging.WARNING, logger="trainer.delivery"):
        assert next_version(client, checkpoint_version=1) == 3
    assert "ahead" not in caplog.text

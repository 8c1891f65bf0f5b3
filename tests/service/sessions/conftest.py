"""Gateway fixtures: our own transformers upstream (a subprocess over a tiny saved model, served as
``tiny``), ``fake_vllm`` (vLLM's wire format, no model, served as ``fake``), and the API under uvicorn (a
subprocess) pointed at one, on a database of its own."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, start_server
from tests.service.sessions.upstreams import Upstream, save_tiny_model, start_fake_vllm, start_infer, stop


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")  # infer serves it by its folder's name


@pytest.fixture(scope="module")
def upstream(model_dir: Path) -> Iterator[Upstream]:
    server = start_infer(model_dir)
    yield server
    stop(server)


@pytest.fixture(scope="module")
def fake() -> Iterator[Upstream]:
    """``tests.service.sessions.fake_upstream`` (vLLM's wire format) for the module's gateways."""
    server = start_fake_vllm()
    yield server
    stop(server)


GATEWAY_ENV = {"GRPO_CURATOR_SESSION_CALL_TIMEOUT_S": "3", "GRPO_CURATOR_SESSION_RETRY_BASE_S": "0.1"}


@pytest.fixture(scope="module")
def gateway_for(make_db: Callable[..., str]) -> Iterator[Callable[..., LiveServer]]:
    """Factory: the API on a new database, its upstream ``url``; stopped at the end of the module."""
    started: list[LiveServer] = []

    def start(url: str, **env: str) -> LiveServer:
        server = start_server(make_db(), env={**GATEWAY_ENV, "GRPO_CURATOR_INFERENCE_URL": url, **env})
        started.append(server)
        return server

    yield start
    stop_servers(started)


def stop_servers(servers: list[LiveServer]) -> None:
    """Stop each as ``tests.conftest.stop_server`` does (SIGTERM, SIGKILL after 10 s), all at once: each
    takes ~0.5 s to shut down, one after another that added up to seconds per module."""
    for server in servers:
        if server.proc.poll() is None:
            server.proc.terminate()
    deadline = time.monotonic() + 10
    for server in servers:
        try:
            server.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="module")
def gateway(gateway_for: Callable[..., LiveServer], upstream: Upstream) -> LiveServer:
    return gateway_for(upstream.url)


@pytest.fixture(scope="module")
def fake_gateway(gateway_for: Callable[..., LiveServer], fake: Upstream) -> LiveServer:
    """The API (default settings) pointed at the module's ``fake``."""
    return gateway_for(fake.url)

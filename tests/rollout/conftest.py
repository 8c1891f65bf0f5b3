"""vLLM fixtures: the tiny random Qwen2 of ``rollout.vllm_server`` saved to a temp dir (with its character
tokenizer, no download), and vLLM's real OpenAI server on it, started once per test session (per xdist
worker; every test that uses it is in ``test_vllm.py``, so with ``--dist loadfile`` one worker starts one).
Tests marked ``vllm`` skip, with the reason, where vLLM's virtualenv is absent (``make vllm``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.vllm_server import VLLMServer, save_tiny_model, unavailable_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"vLLM: {reason}")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


# sampling defaults a model may ship in its generation_config.json (vLLM reads all of these by default): none
# may enter sampling, or the behaviour log-probs are not the trainer's. The session's model carries them, so
# every log-prob check against the session's server checks that too.
GENERATION_PENALTIES = {"repetition_penalty": 3.0, "presence_penalty": 1.5, "frequency_penalty": 1.0, "top_k": 5,
                        "top_p": 0.5, "min_p": 0.2, "max_new_tokens": 3}


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import json

    path = save_tiny_model(tmp_path_factory.mktemp("vllm") / "model")
    gc_path = path / "generation_config.json"
    gc = json.loads(gc_path.read_text()) if gc_path.exists() else {}
    gc_path.write_text(json.dumps({**gc, **GENERATION_PENALTIES}))
    return path


@pytest.fixture(scope="session")
def vllm_server(vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"vLLM: {reason}")
    server = VLLMServer(vllm_model, log_path=tmp_path_factory.mktemp("vllm-log") / "vllm.log")
    try:
        server.wait_ready(900)
        yield server
    finally:
        server.stop()

"""vLLM fixtures: the tiny random Qwen2 of ``rollout.vllm_server`` (with its character tokenizer, no
download) at a path named by its content, and vLLM's real OpenAI server on it, started once: every test that
uses it is in ``test_vllm.py`` (with ``--dist loadfile`` one worker runs them all), and it stops when that
module ends instead of idling to the end of the run. Tests marked ``vllm`` skip, with the reason, where vLLM's
virtualenv is absent (``make vllm``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.vllm_server import VLLM_ARGS_ENV, VLLMServer, save_tiny_model, unavailable_reason
from tests.rollout.vllm_helpers import FAST_START_ARGS, FAST_START_ENV


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
    return content_addressed(path)


def content_addressed(path: Path) -> Path:
    """A copy of the model folder ``path`` at a path named by a hash of its files (under the cache folder of
    ``make vllm``'s virtualenv; no test writes into it), the same in every run while the model is the same.
    vLLM keys its torch.compile cache by the model's path: on a new temp path every run the server compiled
    again (measured: a server start 52 s on a new path, 36 s on a path it had served before)."""
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-curator" / "test-models"
    target = cache / f"tiny-qwen2-{digest.hexdigest()[:20]}"
    if not target.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
        shutil.copytree(path, staging, dirs_exist_ok=True)
        try:
            staging.rename(target)  # atomic: a concurrent run sees all of it or none
        except OSError:  # another run put the same files there first
            shutil.rmtree(staging, ignore_errors=True)
    return target


@pytest.fixture(scope="module")
def vllm_server(vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"vLLM: {reason}")
    # started as vllm_helpers.FAST_START_ARGS says, unless GRPO_CURATOR_VLLM_ARGS is given
    fast = VLLM_ARGS_ENV not in os.environ
    with pytest.MonkeyPatch.context() as env:
        for name, value in FAST_START_ENV.items() if fast else ():
            env.setenv(name, value)  # the server's environment is this process's at its start
        server = VLLMServer(vllm_model, log_path=tmp_path_factory.mktemp("vllm-log") / "vllm.log",
                            extra_args=FAST_START_ARGS.split() if fast else [])
    try:
        server.wait_ready(900)
        yield server
    finally:
        server.stop()

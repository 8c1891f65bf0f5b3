"""One live service (uvicorn subprocess, fresh database) for the integration tests, with a reward spec and an
allowlisted python.function file (one that answers and one that never returns)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, start_server, stop_server

USER_FUNCTIONS = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip().endswith(str(ground_truth))), "source": data_source}

def checksum(data_source, solution_str, ground_truth, extra_info=None):
    return sum(ord(c) for c in solution_str) % 97 / 97

def hang(data_source, solution_str, ground_truth, extra_info=None):
    if "hang" in solution_str:
        time.sleep(3600)
    return 1.0
'''

MAX_SCORE_ITEMS = 16

SPEC = {
    "name": "integ",
    "components": [
        {"name": "correct", "kind": "verifier.exact_match", "outcome": True, "params": {"extract_pattern": "(\\d+)"}},
        {"name": "fmt", "kind": "rule.format", "weight": 0.5, "params": {"required_tags": ["answer"]}},
    ],
}


@pytest.fixture(scope="session")
def service(make_db: Callable[..., str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(make_db(), env=service_env(Path(tmp_path_factory.mktemp("fn"))))
    try:
        assert httpx.post(f"{server.url}/v1/reward-specs", json=SPEC).status_code == 201
        yield server
    finally:
        stop_server(server)


def service_env(folder: Path) -> dict[str, str]:
    """The integration service's settings, its allowlisted functions written into ``folder``."""
    path = folder / "user_reward.py"
    path.write_text(USER_FUNCTIONS)
    return {"GRPO_CURATOR_PYTHON_FUNCTIONS": json.dumps({"mine": str(path), "hang": f"{path}:hang",
                                                         "checksum": f"{path}:checksum"}),
           "GRPO_CURATOR_COMPONENT_TIMEOUT_S": "2", "GRPO_CURATOR_WORKER_PROCESSES": "2",
           # below the adapters' first chunk (256): every adapter must learn the limit from the 413
           "GRPO_CURATOR_MAX_SCORE_ITEMS": str(MAX_SCORE_ITEMS)}


ALPHABET = "0123456789+*=? abcdefghijklmnopqrstuvwxyz<>/"


def skip_unless_installed(**reasons: str) -> None:
    """Skip the calling test module (at collection) where a top-level package it tests against is not installed:
    package name -> why the module needs it and what installs it. ``make install-dev`` installs every one, so CI
    runs these modules; a machine set up by hand without the upstream extra skips them, saying what is missing.
    Found without importing it: verl imports ray, torch and pandas (~3 s), and a module-level import costs every
    pytest-xdist worker that at collection, not only the worker that runs the module."""
    import importlib.util

    for name, reason in reasons.items():
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed: {reason}", allow_module_level=True)


def package_dir(name: str) -> Path:
    """An installed package's folder, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations)))


def char_tokenizer():
    """One token per character; pad / eos specials; decoding joins characters back without spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "</s>", "<unk>", *ALPHABET])}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    inner.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")

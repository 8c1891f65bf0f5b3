"""The producer restarts its own vLLM server on a new trainer checkpoint (test_vllm.py's module server is not
used: a file of its own, so ``--dist loadfile`` runs it on another worker while test_vllm.py's server starts
and serves). Skipped with the reason where vLLM's virtualenv is absent (``make vllm``)."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollout.producer import Policy, build_group
from rollout.tasks import load_tokenizer
from rollout.vllm_server import VLLM_ARGS_ENV, torch_cache_name
from service.client import CuratorClient
from tests.conftest import LiveServer, stop_server
from tests.rollout.vllm_helpers import (
    FAST_START_ARGS,
    FAST_START_ENV,
    letter_sum_service,
    perturbed_checkpoint,
    producer_cfg,
    sampled_with,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def service(make_db: Callable[..., str]) -> Iterator[LiveServer]:
    """The API with the letter-sum dataset (the producer samples with its own server: no gateway upstream)."""
    server = letter_sum_service(make_db())
    yield server
    stop_server(server)


def test_producer_restarts_its_vllm_on_a_new_checkpoint_with_its_version(service, vllm_model, tmp_path, monkeypatch):
    """The producer's own server (started as the demo starts it: no tokenizer, token ids only), restarted on the
    trainer's checkpoint; the next groups carry its policy version and were sampled with its weights.

    Its two servers start as vllm_helpers.FAST_START_ARGS says (eager, one process) unless GRPO_CURATOR_VLLM_ARGS
    is given: this test checks which weights are served, not the compiled path or vLLM's process layout."""
    if VLLM_ARGS_ENV not in os.environ:
        monkeypatch.setenv(VLLM_ARGS_ENV, FAST_START_ARGS)
        for name, value in FAST_START_ENV.items():
            monkeypatch.setenv(name, value)
    ckpts = tmp_path / "ckpts"
    cfg = producer_cfg(service, None, vllm_model, tmp_path, checkpoint_dir=str(ckpts), producer_id="restart",
                       max_tokens=8)
    policy = Policy(cfg, load_tokenizer(cfg.tokenizer))
    with CuratorClient(service.url) as c:
        [req_a, req_b] = c.sampling_requests(2, producer_id="restart", dataset="letter-sum")
    temp_before = litter()
    own_dirs = []
    try:
        policy.refresh()
        before = build_group(policy, req_a, cfg)
        assert before["policy_version"] == 0 and sampled_with(before, vllm_model) < 1e-4
        own_dirs.append(serving_dir(policy))
        ckpt = perturbed_checkpoint(vllm_model, ckpts, version=3)
        assert policy.refresh() is True and policy.version == 3 and policy.checkpoint == ckpt
        assert not own_dirs[0].exists()  # the first server's directory went with it
        own_dirs.append(serving_dir(policy))
        after = build_group(policy, req_b, cfg)
        assert after["policy_version"] == 3 and after["id"].endswith("-v3")
        assert sampled_with(after, ckpt) < 1e-4  # the new weights sampled
        assert sampled_with(after, vllm_model) > 1e-2  # not the old ones
        with CuratorClient(service.url) as c:
            c.post_group(after)
            assert c.get_group(after["id"])["policy_version"] == 3
    finally:
        policy.close()
    assert policy.sampler is None
    assert [d for d in own_dirs if d.exists()] == []
    assert litter() - temp_before == set()  # vLLM's sockets and file store never landed in the shared temp dir


# what vLLM 0.32 leaves in its temp directory: ZMQ sockets named by a uuid4, a torch.distributed file store
LITTER = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}|vllm_dist_[0-9a-f]{32}")


def litter() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if LITTER.fullmatch(name)}


def serving_dir(policy: Policy):
    """The running server's own temp directory, checked to hold its ZMQ sockets (so the redirection took) and
    to reach torch's compile cache in the shared temp dir (what a restart compiled before is not compiled again)."""
    server = policy.sampler.server
    sockets = [p.name for p in server.tmp.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
    assert sockets and all(LITTER.fullmatch(name) for name in sockets), sockets
    cache = server.tmp / torch_cache_name()
    assert cache.is_symlink() and cache.resolve() == (Path(tempfile.gettempdir()) / cache.name).resolve()
    return server.tmp

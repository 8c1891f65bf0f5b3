"""What the vLLM tests share (test_vllm.py against the module's one vLLM server, test_vllm_restart.py with the
producer's own servers): the tiny model's token constants, the trainer's log-prob recomputation, the API with
the letter-sum dataset, a producer configuration and a perturbed trainer checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rollout.producer import RolloutConfig
from rollout.tasks import letter_sum_prompts, letter_sum_spec
from rollout.vllm_server import ALPHABET
from service.client import CuratorClient
from tests.conftest import LiveServer, start_server

# How the tests start vLLM, unless GRPO_CURATOR_VLLM_ARGS says otherwise: eager (vLLM's torch.compile warm-up is
# most of a CPU start, and what the tests check -- token ids, processed log-probs, finish reasons, which weights
# are served -- is the server's contract, the same compiled or eager), and as one process: the engine core in the
# API server's process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and the model in the engine's (the "uni" executor)
# instead of three processes that each import torch and vLLM. Measured on 2 cores: ready in 17 s instead of 28.
FAST_START_ARGS = "--enforce-eager --distributed-executor-backend uni"
FAST_START_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

EOS = 2  # <|im_end|> in the tiny model's tokenizer, and rollout.tasks' EOS
# the producer's tokenizer: rollout.tasks' character tokenizer over the tiny model's whole vocabulary (ids 0-2
# PAD / BOS / EOS, then one character per id: "§" stands for <|im_start|>, then vllm_server.ALPHABET)
CHAR_SPEC = "char:\u00a7" + ALPHABET


def recompute(model_dir: str | Path, token_ids: list[int], temperature: float) -> list[float]:
    """The trainer's own log-probs (trainer.policy.PolicyLogprobs, fp32) of token_ids[1:] given the prefix."""
    from transformers import AutoModelForCausalLM

    from trainer.policy import PolicyLogprobs

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    policy = PolicyLogprobs(model, temperature=temperature).eval()
    ids = torch.tensor([token_ids])  # (1, L)
    targets = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # (1, L): position t predicts token t+1
    with torch.no_grad():
        logp, _ = policy(ids, torch.arange(ids.shape[1]).unsqueeze(0), None, targets)  # (1, L)
    return logp[0, :-1].tolist()


def letter_sum_service(db_url: str, env: dict[str, str] | None = None) -> LiveServer:
    """The API on ``db_url`` with the letter-sum dataset (prompts, reward spec)."""
    server = start_server(db_url, env=env)
    with CuratorClient(server.url) as c:
        c.upsert_prompts(letter_sum_prompts())
        c.create_reward_spec(letter_sum_spec())
        c.set_dataset("letter-sum", reward_spec="letter-sum")
    return server


def producer_cfg(service: LiveServer, url: str | None, model: Path, tmp_path: Path, **extra: Any) -> RolloutConfig:
    producer = extra.pop("producer_id", "pv")
    extra.setdefault("max_tokens", 12)
    return RolloutConfig(service_url=service.url, producer_id=producer, run_id=producer, model=str(model),
                         tokenizer=CHAR_SPEC, dataset="letter-sum", group_size=4, requests_per_poll=2,
                         spool_dir=str(tmp_path / "spool"), backend="vllm", vllm_url=url, **extra)


def perturbed_checkpoint(model_dir: Path, ckpts: Path, version: int) -> Path:
    """A trainer checkpoint (trainer.checkpoint.save_checkpoint) of weights moved far from ``model_dir``'s."""
    from transformers import AutoModelForCausalLM

    from trainer.checkpoint import TrainerState, save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    torch.manual_seed(version)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return save_checkpoint(ckpts, model, torch.optim.SGD(model.parameters(), lr=0.1),
                           TrainerState(policy_version=version, step=version))


def sampled_with(group: dict[str, Any], model_dir: Path) -> float:
    """Largest gap between the group's first trajectory's log-probs and ``model_dir``'s recomputation."""
    t = group["trajectories"][0]
    prompt_len = t["loss_mask"].index(1)
    ours = recompute(model_dir, t["token_ids"], 1.0)[prompt_len - 1:]
    return max(abs(a - b) for a, b in zip(ours, t["logprobs"][prompt_len:], strict=True))

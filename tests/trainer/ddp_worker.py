"""One rank of the data-parallel check in test_step.py (run as `python -m tests.trainer.ddp_worker OUT`
under RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, the variables torchrun sets).

For each scenario the rank trains one step on its own share of a batch and saves the parameters;
the test compares them with one process stepping on the combined batch (`single_process`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from tests.trainer.batches import make_batch, tiny_model
from trainer.loss import LossConfig
from trainer.packing import empty_micro_batch, pack_batch
from trainer.parallel import DistContext, init_distributed, wrap_policy
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step

# name -> (parallel mode, aggregation, groups of rank 0, groups of rank 1)
SCENARIOS: dict[str, tuple[str, str, slice, slice]] = {
    "ddp-token-mean": ("ddp", "token-mean", slice(0, 1), slice(1, 3)),
    "ddp-seq-mean-token-mean": ("ddp", "seq-mean-token-mean", slice(0, 2), slice(2, 3)),
    "ddp-seq-mean-token-sum": ("ddp", "seq-mean-token-sum", slice(0, 1), slice(1, 3)),
    "ddp-rank1-empty": ("ddp", "token-mean", slice(0, 3), slice(3, 3)),
    "fsdp-token-mean": ("fsdp", "token-mean", slice(0, 1), slice(1, 3)),
}
LR, CLIP, BUDGET = 0.5, 0.5, 24


def _step(
    policy: torch.nn.Module, model: torch.nn.Module, batch: dict[str, Any], agg: str
) -> dict[str, float]:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    mbs = pack_batch(batch, BUDGET, "pad") if batch["groups"] else [empty_micro_batch()]
    return train_step(policy, opt, mbs, StepConfig(loss=LossConfig(agg=agg, beta=0.0), max_grad_norm=CLIP))


def single_process(agg: str) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The reference: one process, the combined batch."""
    model = tiny_model()
    ctx = DistContext(rank=0, world_size=1, device=torch.device("cpu"))
    metrics = _step(wrap_policy(PolicyLogprobs(model, 5), "ddp", ctx), model, make_batch(seed=9), agg)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def _full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def main(out: Path) -> None:
    ctx = init_distributed("cpu")
    for name, (mode, agg, share0, share1) in SCENARIOS.items():
        model = tiny_model()
        policy = wrap_policy(PolicyLogprobs(model, 5), mode, ctx)
        batch = make_batch(seed=9)
        batch["groups"] = batch["groups"][share0 if ctx.rank == 0 else share1]
        metrics = _step(policy, model, batch, agg)
        state = _full_state(model)
        if ctx.rank == 0:
            torch.save(state, out / f"{name}.pt")
            (out / f"{name}.json").write_text(json.dumps(metrics))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Checkpoints: model.safetensors + config.json + optimizer.pt + trainer_state.json per step.

Layout: `<dir>/step-<8 digits>/`. A checkpoint is written into `step-N.tmp` and renamed when
complete, so a crash mid-save leaves the previous checkpoint as the latest. The model files are
what `transformers.AutoModelForCausalLM.from_pretrained(<checkpoint>)` reads (tied weights are
stored once), so a sampler can load a checkpoint directly. State dicts are gathered with
torch.distributed.checkpoint's full-state-dict API, which works for plain, DDP and FSDP2 models
(a collective under FSDP: every rank calls `save_checkpoint`, rank 0 writes).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from trainer.checkpoint_layout import STATE_FILE
from trainer.checkpoint_layout import checkpoints as _checkpoints  # noqa: F401 -- re-exported
from trainer.checkpoint_layout import latest_checkpoint as latest_checkpoint
from trainer.checkpoint_readers import prune

MODEL_FILE, OPTIM_FILE = "model.safetensors", "optimizer.pt"


@dataclass(frozen=True)
class TrainerState:
    """What resuming needs besides tensors: the last published policy version and the step count, and
    the delivery ledger written atomically with the weights (trainer.delivery.Ledger): ``pending``, the
    batches ({"batch_id", "groups"}) whose update this checkpoint holds and that may not be acked yet
    (acked on resume), and ``trained``, ids of groups whose update it holds but whose ack was refused
    (if they come back in a lease, they are acked without training)."""

    policy_version: int
    step: int
    pending: tuple[dict, ...] = ()
    trained: tuple[str, ...] = ()


def _duplicate_names(model: nn.Module) -> set[str]:
    """Parameter names that share their Parameter with an earlier name (tied embeddings)."""
    seen: set[int] = set()
    dups = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            dups.add(name)
        seen.add(id(p))
    return dups


def save_checkpoint(
    ckpt_dir: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    is_main: bool = True,
    keep_last: int | None = None,
) -> Path:
    """Write a checkpoint of `model` (the transformers model, unwrapped or FSDP-sharded) -> its path.
    keep_last: delete all but the newest `keep_last` checkpoints afterwards (None keeps all)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=opts)
    optim = get_optimizer_state_dict(model, optimizer, options=opts)
    final = Path(ckpt_dir) / f"step-{state.step:08d}"
    if not is_main:
        return final
    dups = _duplicate_names(model)
    tensors = {k: v.contiguous() for k, v in weights.items() if k not in dups and isinstance(v, torch.Tensor)}
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})
    config = getattr(model, "config", None)
    if config is not None:
        config.to_json_file(str(tmp / "config.json"))
    torch.save(optim, tmp / OPTIM_FILE)
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state)))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if keep_last is not None:
        prune(ckpt_dir, keep_last)  # skips checkpoints a producer is loading
    return final


def load_model_weights(path: str | Path, model: nn.Module) -> None:
    """Load a checkpoint's weights into an unwrapped model (call before DDP / FSDP wrapping)."""
    tensors = load_file(str(Path(path) / MODEL_FILE))
    result = model.load_state_dict(tensors, strict=False)
    missing = set(result.missing_keys) - _duplicate_names(model)
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {sorted(missing)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )


def load_optimizer_state(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore the optimizer state saved beside the weights (after wrapping; the model is the
    transformers model the optimizer's parameters belong to)."""
    optim = torch.load(Path(path) / OPTIM_FILE, map_location="cpu", weights_only=True)
    set_optimizer_state_dict(model, optimizer, optim, options=StateDictOptions(full_state_dict=True))


def load_trainer_state(path: str | Path) -> TrainerState:
    """The policy version and step saved in a checkpoint."""
    raw = json.loads((Path(path) / STATE_FILE).read_text())
    return TrainerState(policy_version=int(raw["policy_version"]), step=int(raw["step"]),
                        pending=tuple(raw.get("pending", ())), trained=tuple(raw.get("trained", ())))

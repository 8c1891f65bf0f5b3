"""Experiment trackers for the trainer's step metrics: Weights & Biases, MLflow, TensorBoard, or a JSONL file.

Chosen with ``GRPO_CURATOR_TRACKERS`` (comma-separated: ``wandb``, ``mlflow``, ``tensorboard``, ``jsonl``;
unset = none). ``GRPO_CURATOR_TRACKER_PROJECT`` names the W&B project / MLflow experiment (default
``grpo-curator``), ``GRPO_CURATOR_TRACKER_DIR`` is where TensorBoard and JSONL write (default
``runs/``), ``GRPO_CURATOR_TRACKER_RUN`` names the run. The tracker packages are optional
(``pip install 'grpo-curator[wandb]'`` / ``[mlflow]`` / ``[tensorboard]``); a configured tracker whose
package is missing fails at start with one line naming the extra.

Metric names follow TRL's ``GRPOTrainer`` where one exists, so dashboards built for TRL runs work:
``loss``, ``kl`` (to the reference), ``entropy``, ``clip_ratio`` (= ``clip_ratio/region_mean``),
``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``grad_norm``, ``reward``, ``reward_std``,
``frac_reward_zero_std``, ``completions/mean_length`` (``/min_length``, ``/max_length``); every other
trainer metric keeps its own name under ``train/`` (``train/approx_kl``, ``train/tis_weight`` ...).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

TRL_NAMES = {
    "loss": "loss",
    "pg_loss": "pg_loss",
    "kl_ref": "kl",
    "entropy": "entropy",
    "clip_frac_low": "clip_ratio/low_mean",
    "clip_frac_high": "clip_ratio/high_mean",
    "grad_norm": "grad_norm",
}
EXTRAS = {
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "tensorboard": ("tensorboard", "tensorboard"),
}


def batch_metrics(batch: Mapping[str, Any] | None) -> dict[str, float]:
    """TRL-style reward and length statistics of one leased batch (JSON form: groups -> trajectories
    with ``total_reward`` and ``loss_mask`` / ``token_ids``)."""
    groups = (batch or {}).get("groups") or []
    stds, rewards, lengths = [], [], []
    for g in groups:
        values = [t["total_reward"] for t in g["trajectories"] if t.get("total_reward") is not None]
        rewards += values
        if values:
            mean = sum(values) / len(values)
            stds.append(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)))
        for t in g["trajectories"]:
            mask = t.get("loss_mask")
            lengths.append(sum(mask) if mask is not None else len(t.get("token_ids") or ()))
    out: dict[str, float] = {}
    if rewards:
        out["reward"] = sum(rewards) / len(rewards)
    if stds:
        out["reward_std"] = sum(stds) / len(stds)
        out["frac_reward_zero_std"] = sum(s <= 1e-12 for s in stds) / len(stds)
    if lengths:
        out.update(
            {
                "completions/mean_length": sum(lengths) / len(lengths),
                "completions/min_length": float(min(lengths)),
                "completions/max_length": float(max(lengths)),
            }
        )
    return out


def trl_metrics(metrics: Mapping[str, float], batch: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The trainer's step metrics under TRL's names, plus the batch's reward / length statistics."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        out[TRL_NAMES.get(key, f"train/{key}")] = float(value)
    if "clip_frac_low" in metrics or "clip_frac_high" in metrics:
        out["clip_ratio"] = out["clip_ratio/region_mean"] = float(
            metrics.get("clip_frac_low", 0.0) + metrics.get("clip_frac_high", 0.0)
        )
    return out | batch_metrics(batch)


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


class JsonlTracker:
    """One JSON object per step in ``<dir>/<run>.jsonl`` (no dependency; easy to load with polars)."""

    def __init__(self, directory: Path, run: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{run}.jsonl"
        self._file = self.path.open("a")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _require(name: str) -> Any:
    module, extra = EXTRAS[name]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(
            f"GRPO_CURATOR_TRACKERS names {name!r} but {module} is not installed: pip install 'grpo-curator[{extra}]'"
        ) from None


class WandbTracker:
    def __init__(self, project: str, run: str, config: Mapping[str, Any]) -> None:
        self._wandb = _require("wandb")
        self._run = self._wandb.init(project=project, name=run, config=dict(config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    def __init__(self, project: str, run: str, config: Mapping[str, Any]) -> None:
        self._mlflow = _require("mlflow")
        self._mlflow.set_experiment(project)
        self._mlflow.start_run(run_name=run)
        self._mlflow.log_params({k: str(v)[:250] for k, v in config.items()})

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._mlflow.log_metrics(dict(metrics), step=step)

    def close(self) -> None:
        self._mlflow.end_run()


class TensorboardTracker:
    def __init__(self, directory: Path, run: str) -> None:
        _require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(directory / run))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Trackers:
    """Every configured tracker; ``log_step`` converts to TRL names once and sends to each."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    def log_step(
        self, step: int, metrics: Mapping[str, float], batch: Mapping[str, Any] | None = None
    ) -> None:
        if self.trackers:
            named = trl_metrics(metrics, batch)
            for tracker in self.trackers:
                tracker.log(step, named)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def from_env(config: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Trackers:
    """The trackers ``GRPO_CURATOR_TRACKERS`` names (none when unset); ValueError for an unknown name or a
    missing package."""
    env = os.environ if env is None else env
    names = [n.strip() for n in env.get("GRPO_CURATOR_TRACKERS", "").split(",") if n.strip()]
    project = env.get("GRPO_CURATOR_TRACKER_PROJECT") or "grpo-curator"
    directory = Path(env.get("GRPO_CURATOR_TRACKER_DIR") or "runs")
    run = env.get("GRPO_CURATOR_TRACKER_RUN") or time.strftime("grpo-%Y%m%d-%H%M%S")
    made: list[Tracker] = []
    for name in names:
        if name == "jsonl":
            made.append(JsonlTracker(directory, run))
        elif name == "wandb":
            made.append(WandbTracker(project, run, config or {}))
        elif name == "mlflow":
            made.append(MlflowTracker(project, run, config or {}))
        elif name == "tensorboard":
            made.append(TensorboardTracker(directory, run))
        else:
            raise ValueError(
                f"GRPO_CURATOR_TRACKERS: unknown tracker {name!r}; valid: jsonl, mlflow, tensorboard, wandb"
            )
    return Trackers(made)

"""Experiment trackers for the trainer's step metrics: Weights & Biases, MLflow, TensorBoard, or a JSONL file.

Chosen with ``GRPO_CURATOR_TRACKERS`` (comma-separated: ``wandb``, ``mlflow``, ``tensorboard``, ``jsonl``;
unset = none). ``GRPO_CURATOR_TRACKER_PROJECT`` names the W&B project / MLflow experiment (default
``grpo-curator``), ``GRPO_CURATOR_TRACKER_DIR`` is where TensorBoard and JSONL write (default
``runs/``), ``GRPO_CURATOR_TRACKER_RUN`` names the run. The tracker packages are optional
(``pip install 'grpo-curator[wandb]'`` / ``[mlflow]`` / ``[tensorboard]``); a configured tracker whose
package is missing fails at start with one line naming the extra.

Metric names follow TRL's ``GRPOTrainer`` where one exists, so runs compare side by side with TRL's
(docs/metrics.md): ``loss``, ``kl`` (to the reference), ``entropy``, ``clip_ratio`` (=
``clip_ratio/region_mean``), ``clip_ratio/low_mean``, ``clip_ratio/low_min``, ``clip_ratio/high_mean``,
``clip_ratio/high_max``, ``grad_norm``, ``learning_rate``, ``num_tokens`` (tokens seen so far, prompt and
completion), ``reward``, ``reward_std`` (TRL's: the sample std of the batch's rewards), ``rewards/<component>/
mean|std`` and ``completions/clipped_ratio`` (when the batch's trajectories carry ``rewards`` /
``finish_reason``), ``frac_reward_zero_std``, ``completions/mean_length`` (``/min_length``, ``/max_length``).
Ours that TRL has no name for keep their own (``approx_kl``, ``tis_weight``, ``reward_std_in_group``: the
mean in-group population std, what GRPO's advantages divide by). Like transformers' callbacks, which TRL logs
through, W&B and TensorBoard get every name under ``train/`` (``train/reward``, ``train/approx_kl``); MLflow
and the JSONL file get the names as they are (as transformers' MLflow callback and TRL's log history do).
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
    "lr": "learning_rate",
}
# W&B and TensorBoard: transformers' callbacks (WandbCallback, TensorBoardCallback) log TRL's names under train/
TRAIN_PREFIX = "train/"
EXTRAS = {
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "tensorboard": ("tensorboard", "tensorboard"),
}


def _std(values: Sequence[float], ddof: int) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - ddof))


def batch_metrics(batch: Mapping[str, Any] | None) -> dict[str, float]:
    """TRL-style reward and length statistics of one leased batch (JSON form: groups -> trajectories
    with ``total_reward`` and ``loss_mask`` / ``token_ids``; ``rewards`` {component: value} and
    ``finish_reason`` when the batch carries them). ``reward_std`` is TRL's (the sample std over the batch,
    logged from two rewards on); ``reward_std_in_group`` is the mean in-group population std."""
    groups = (batch or {}).get("groups") or []
    stds, rewards, lengths, finished = [], [], [], []
    per_component: dict[str, list[float]] = {}
    for g in groups:
        values = [t["total_reward"] for t in g["trajectories"] if t.get("total_reward") is not None]
        rewards += values
        if values:
            stds.append(_std(values, 0))
        for t in g["trajectories"]:
            mask = t.get("loss_mask")
            lengths.append(sum(mask) if mask is not None else len(t.get("token_ids") or ()))
            if isinstance(t.get("finish_reason"), str):
                finished.append(t["finish_reason"])
            for name, value in (t.get("rewards") or {}).items():
                if isinstance(value, int | float) and math.isfinite(value):
                    per_component.setdefault(str(name), []).append(float(value))
    out: dict[str, float] = {}
    if rewards:
        out["reward"] = sum(rewards) / len(rewards)
    if len(rewards) > 1:
        out["reward_std"] = _std(rewards, 1)
    if stds:
        out["reward_std_in_group"] = sum(stds) / len(stds)
        out["frac_reward_zero_std"] = sum(s <= 1e-12 for s in stds) / len(stds)
    for name, values in per_component.items():
        out[f"rewards/{name}/mean"] = sum(values) / len(values)
        if len(values) > 1:
            out[f"rewards/{name}/std"] = _std(values, 1)
    if finished:
        out["completions/clipped_ratio"] = sum(f == "length" for f in finished) / len(finished)
    if lengths:
        out.update(
            {
                "completions/mean_length": sum(lengths) / len(lengths),
                "completions/min_length": float(min(lengths)),
                "completions/max_length": float(max(lengths)),
            }
        )
    return out


def batch_tokens(batch: Mapping[str, Any] | None) -> int:
    """Tokens of the batch's sequences (prompt and completion: the ``token_ids``), as TRL's ``num_tokens`` counts."""
    return sum(len(t.get("token_ids") or ()) for g in (batch or {}).get("groups") or [] for t in g["trajectories"])


def trl_metrics(metrics: Mapping[str, float], batch: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The trainer's step metrics under TRL's names (ours without one keep theirs), plus the batch's reward /
    length statistics. ``clip_ratio/low_min`` / ``high_max``: TRL's min / max over processes of each process's
    clip fraction; the trainer reports the fraction over all ranks together, which is both here."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        out[TRL_NAMES.get(key, key)] = float(value)
    if "clip_frac_low" in metrics or "clip_frac_high" in metrics:
        low, high = float(metrics.get("clip_frac_low", 0.0)), float(metrics.get("clip_frac_high", 0.0))
        out["clip_ratio"] = out["clip_ratio/region_mean"] = low + high
        out["clip_ratio/low_min"] = float(metrics.get("clip_frac_low_min", low))
        out["clip_ratio/high_max"] = float(metrics.get("clip_frac_high_max", high))
    return out | batch_metrics(batch)


def with_prefix(metrics: Mapping[str, float], prefix: str = TRAIN_PREFIX) -> dict[str, float]:
    """Every name under ``prefix``, as transformers' ``rewrite_logs`` does for W&B and TensorBoard."""
    return {f"{prefix}{k}": v for k, v in metrics.items()}


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
        self._run.log(with_prefix(metrics), step=step)

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
        for key, value in with_prefix(metrics).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Trackers:
    """Every configured tracker; ``log_step`` converts to TRL names once and sends to each (W&B and
    TensorBoard add ``train/`` themselves). ``learning_rate``: logged every step unless the step metrics
    carry ``lr``; ``num_tokens`` counts every batch's tokens from the start of this process."""

    def __init__(self, trackers: Sequence[Tracker], learning_rate: float | None = None) -> None:
        self.trackers = list(trackers)
        self.learning_rate = learning_rate
        self.num_tokens = 0

    def log_step(
        self, step: int, metrics: Mapping[str, float], batch: Mapping[str, Any] | None = None
    ) -> None:
        self.num_tokens += batch_tokens(batch)
        if self.trackers:
            named = trl_metrics(metrics, batch)
            if self.learning_rate is not None:
                named.setdefault("learning_rate", float(self.learning_rate))
            named["num_tokens"] = float(self.num_tokens)
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
    lr = (config or {}).get("lr")
    return Trackers(made, learning_rate=float(lr) if isinstance(lr, int | float) else None)

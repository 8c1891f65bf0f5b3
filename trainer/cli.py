"""`grpo-curator train`: the command `service.cli` routes to (see `trainer.worker` for the options)."""

from __future__ import annotations

from trainer.worker import main

__all__ = ["main"]

"""Where checkpoints live: `<dir>/step-<8 digits>/`, complete once `trainer_state.json` is in it.

Shared by the writer (`trainer.checkpoint`) and the readers (`trainer.checkpoint_readers`); needs no torch.
"""

from __future__ import annotations

import re
from pathlib import Path

STEP_DIR = re.compile(r"^step-(\d+)$")
STATE_FILE = "trainer_state.json"


def checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete checkpoints under `ckpt_dir`, oldest first."""
    if not Path(ckpt_dir).is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in Path(ckpt_dir).iterdir()
        if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(ckpt_dir: str | Path | None) -> Path | None:
    """The complete checkpoint with the highest step under `ckpt_dir`, None when there is none."""
    found = [] if ckpt_dir is None else checkpoints(ckpt_dir)
    return found[-1] if found else None

"""The CLI tests' zygote (tests/service/cli/commands.py): one per module that asks for ``forked``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ROOT
from tests.forked_cli import Zygote
from tests.service.cli.commands import Forked


@pytest.fixture(scope="module")
def forked() -> Iterator[Forked]:
    with Zygote(cwd=str(ROOT)) as zygote:
        yield Forked(zygote)

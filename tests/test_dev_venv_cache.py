"""``make install-dev-cached`` (what ``.ci/run`` uses): a clone without a ``.venv`` gets a hard-linked copy of
the test virtualenv kept outside the clone (``~/.cache/grpo-curator/venv-dev-<key>``), its scripts naming the
clone's ``.venv`` and the project installed again, editable, from the clone. Here the cache is made from this
run's own ``.venv`` (a hard-linked copy: nothing is installed) in a cache home of the test's own, and the clone
is a copy of this checkout's sources; building a cache for real is what every CI run on a new machine does."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

VENV = Path(sys.prefix)  # this run's virtualenv (ROOT/.venv under make test)


def _make(src: Path, cache_home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "MAKE"))}
    env["XDG_CACHE_HOME"] = str(cache_home)
    return subprocess.run(["make", "-s", "-C", str(src), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    src = tmp_path / "clone"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".venv.partial", ".git", "__pycache__", "*.egg-info", ".grpo-curator", ".hypothesis", ".ruff_cache"))
    return src


def _fake_cache(src: Path, cache_home: Path) -> Path:
    """A complete cache at the key of ``src``: this run's venv, hard-linked, its scripts naming the cache (as
    a built one's do; each rewritten file is a new one, so this run's venv is untouched)."""
    run = _make(src, cache_home, "dev-cache-dir")
    assert run.returncode == 0, run.stderr
    cache = Path(run.stdout.strip())
    assert cache.parent == cache_home / "grpo-curator" and cache.name.startswith("venv-dev-")
    cache.parent.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(VENV), str(cache)], check=True)
    for script in (cache / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if str(VENV).encode() in data and b"\0" not in data[:4096]:
            mode = script.stat().st_mode
            script.unlink()
            script.write_bytes(data.replace(str(VENV).encode(), str(cache).encode()))
            script.chmod(mode)
    (cache / ".complete").touch()
    return cache


def _python_of(venv: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=120, cwd="/").stdout.strip()


def test_a_clone_gets_a_linked_copy_naming_itself_and_the_cache_stays_as_built(clone, tmp_path):
    cache_home = tmp_path / "cache"
    cache = _fake_cache(clone, cache_home)
    finder = sorted((cache / "lib").glob("python3*/site-packages/__editable___grpo_curator_*_finder.py"))
    cached = {p: p.read_bytes() for p in [*finder, cache / "bin" / "grpo-curator", cache / "bin" / "activate"]}
    own_script = (VENV / "bin" / "grpo-curator").read_bytes()
    (clone / ".venv.partial").mkdir()  # a copy an earlier run left half made
    (clone / ".venv.partial" / "junk").write_text("x")
    older = cache.parent / "venv-dev-0000000000000000-py311"  # a cache of an older Makefile: removed
    (older / "bin").mkdir(parents=True)
    (older / ".complete").touch()
    building = cache.parent / "venv-dev-1111111111111111-py311"  # another clone is building it: kept
    building.mkdir()
    busy = cache.parent / "venv-dev-2222222222222222-py311"  # complete, but its lock is held: kept
    busy.mkdir()
    (busy / ".complete").touch()
    with open(f"{busy}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = _make(clone, cache_home, "install-dev-cached")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "(cached)" in run.stdout and f"from {cache}" in run.stdout
    venv = clone / ".venv"
    assert not (clone / ".venv.partial").exists() and not (venv / ".complete").exists()
    assert (not older.exists(), building.exists(), busy.exists()) == (True, True, True)
    # the clone's venv runs the clone's code and names itself
    assert _python_of(venv, "import service, sys; print(service.__file__)") == str(clone / "service" / "__init__.py")
    for name in ("grpo-curator", "pytest", "activate"):
        text = (venv / "bin" / name).read_text()
        assert str(venv) in text and str(cache) not in text, name
    help_run = subprocess.run([str(venv / "bin" / "grpo-curator"), "--help"], capture_output=True, text=True,
                              timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert help_run.returncode == 0 and "serve" in help_run.stdout
    # the installed packages are the cache's files (linked, not copied): what torch imports is shared
    torch_init = next((venv / "lib").glob("python3*/site-packages/torch/__init__.py"))
    assert torch_init.stat().st_ino == (cache / torch_init.relative_to(venv)).stat().st_ino
    # nothing of the cache (nor of this run's venv, linked to it) was written in place
    assert {p: p.read_bytes() for p in cached} == cached
    assert (VENV / "bin" / "grpo-curator").read_bytes() == own_script
    # make test's own install step has nothing left to do
    again = _make(clone, cache_home, "install-dev")
    assert again.returncode == 0 and "pip" not in again.stdout + again.stderr, again.stdout + again.stderr


def test_a_clone_with_its_own_venv_keeps_it(clone, tmp_path):
    """A ``.venv`` already there (a developer's) is left to ``make install-dev``: nothing copied over or into it."""
    cache_home = tmp_path / "cache"
    cache = _fake_cache(clone, cache_home)
    venv = clone / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "upstream" / "openrlhf-0.11.2").mkdir(parents=True)
    for stamp in (".installed", ".installed-dev", "upstream/openrlhf-0.11.2/.complete"):
        (venv / stamp).write_text("")  # newer than pyproject.toml: install-dev has nothing to do
    (venv / "mine").write_text("a developer's venv")
    run = _make(clone, cache_home, "install-dev-cached")
    assert run.returncode == 0, run.stdout + run.stderr
    assert str(cache) not in run.stdout + run.stderr
    assert sorted(p.name for p in venv.iterdir()) == [".installed", ".installed-dev", "bin", "mine", "upstream"]
    assert (venv / "mine").read_text() == "a developer's venv" and not (clone / ".venv.partial").exists()

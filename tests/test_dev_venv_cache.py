"""``make install-dev-cached`` (what ``.ci/run`` uses; ``.ci/dev-venv``): a clone without a ``.venv`` gets a
hard-linked copy of the test virtualenv kept outside the clone (``~/.cache/grpo-curator/venv-dev-<key>``), its
scripts naming the clone's ``.venv`` and the project installed again, editable, from the clone. Here the cache is
made from this run's own ``.venv`` (a hard-linked copy: nothing is installed) in a cache home of the test's own,
and the clone is a copy of this checkout's sources; building a cache for real is what every CI run on a new
machine does. ``PY=false`` stops a build (or the plain install) at its first step, where a test needs only to
see that it began."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT

VENV = Path(sys.prefix)  # this run's virtualenv (ROOT/.venv under make test)


def _make(src: Path, cache_home: Path | str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "MAKE"))}
    env["XDG_CACHE_HOME"] = str(cache_home)
    return subprocess.run(["make", "-s", "-C", str(src), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    src = tmp_path / "clone"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".venv.partial", ".git", "__pycache__", "*.egg-info", ".grpo-curator", ".hypothesis", ".ruff_cache"))
    return src


# what the fake caches run needs of this run's venv: pip and setuptools (the editable install), what `grpo-curator
# --help` and `import service` import, and sqlalchemy (a package to compare inodes with); the rest of the venv
# (77k files, torch's 15k among them) is left out: each fake cache is linked twice a test, and what the copy does
# to a full-size venv is what every CI run's own `make install-dev-cached` does
KEEP = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth", "pydantic", "annotated_types",
        "typing_extensions", "typing_inspection", "dotenv", "python_dotenv", "sqlalchemy", "__editable__",
        "grpo_curator")


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's venv hard-linked with only KEEP's packages (and their dist-info) in site-packages."""
    slim = tmp_path_factory.mktemp("slim") / "venv"
    slim.mkdir()
    top = [p for p in VENV.iterdir() if p.name != "lib"]
    subprocess.run(["cp", "-al", *map(str, top), str(slim)], check=True)
    for site in VENV.glob("lib/python3*/site-packages"):
        dst = slim / site.relative_to(VENV)
        dst.mkdir(parents=True)
        keep = [str(p) for p in site.iterdir() if p.name.lower().startswith(KEEP)]
        subprocess.run(["cp", "-al", *keep, str(dst)], check=True)
    return slim


@pytest.fixture
def fake_cache(slim_venv: Path) -> Callable[..., Path]:
    """``make(src, cache_home, *make_args)``: a complete cache at the key of ``src``, this run's venv (slim,
    hard-linked), its scripts naming the cache (as a built one's do; each rewritten file is a new one, so this
    run's venv is untouched)."""

    def make(src: Path, cache_home: Path | str, *args: str) -> Path:
        run = _make(src, cache_home, "dev-cache-dir", *args)
        assert run.returncode == 0, run.stderr
        cache = Path(run.stdout.strip())  # Path: "a//b/" as one spelling, the one python -m venv writes
        assert cache.parent == Path(cache_home) / "grpo-curator" and cache.name.startswith("venv-dev-")
        cache.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(slim_venv), str(cache)], check=True)
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

    return make


def _python_of(venv: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=120, cwd="/").stdout.strip()


def _other(home: Path, name: str, *, complete: bool, age_s: float = 0) -> Path:
    d = home / f"venv-dev-{name}-py311"
    (d / "bin").mkdir(parents=True)
    if complete:
        (d / ".complete").touch()
        os.utime(d / ".complete", (time.time() - age_s,) * 2)
    return d


@pytest.mark.parametrize("spelling", ["", "//"])  # XDG_CACHE_HOME as given, and with "//" after it
def test_a_clone_gets_a_linked_copy_naming_itself_and_the_cache_stays_as_built(fake_cache, clone, tmp_path, spelling):
    cache_home = f"{tmp_path / 'cache'}{spelling}"
    cache = fake_cache(clone, cache_home)
    finder = sorted((cache / "lib").glob("python3*/site-packages/__editable___grpo_curator_*_finder.py"))
    cached = {p: p.read_bytes() for p in [*finder, cache / "bin" / "grpo-curator", cache / "bin" / "activate"]}
    own_script = (VENV / "bin" / "grpo-curator").read_bytes()
    (clone / ".venv.partial").mkdir()  # a copy an earlier run left half made
    (clone / ".venv.partial" / "junk").write_text("x")
    home = cache.parent
    # other keys' caches: the 2 newest complete ones stay, older ones go unless in use; an unfinished build
    # goes unless it is still building (its lock held); no lock file is ever removed
    newest, newer, old = (_other(home, n, complete=True, age_s=a) for n, a in (("1", 10), ("2", 20), ("3", 30)))
    oldest_busy = _other(home, "4", complete=True, age_s=40)
    abandoned, building = _other(home, "5", complete=False), _other(home, "6", complete=False)
    for d in (old, abandoned):
        Path(f"{d}.lock").touch()
    with open(f"{oldest_busy}.lock", "w") as busy, open(f"{building}.lock", "w") as build:
        fcntl.flock(busy, fcntl.LOCK_EX)
        fcntl.flock(build, fcntl.LOCK_EX)
        run = _make(clone, cache_home, "install-dev-cached")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "(cached)" in run.stdout and f"from {cache}" in run.stdout
    assert {d.name: d.exists() for d in (newest, newer, old, oldest_busy, abandoned, building)} == {
        newest.name: True, newer.name: True, old.name: False, oldest_busy.name: True, abandoned.name: False,
        building.name: True}
    assert Path(f"{old}.lock").exists() and Path(f"{abandoned}.lock").exists()
    venv = clone / ".venv"
    assert not (clone / ".venv.partial").exists() and not (venv / ".complete").exists()
    # the clone's venv runs the clone's code and names itself
    assert _python_of(venv, "import service, sys; print(service.__file__)") == str(clone / "service" / "__init__.py")
    for name in ("grpo-curator", "pytest", "pip", "activate"):
        text = (venv / "bin" / name).read_text()
        assert str(venv) in text and str(cache) not in text, name
    help_run = subprocess.run([str(venv / "bin" / "grpo-curator"), "--help"], capture_output=True, text=True,
                              timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert help_run.returncode == 0 and "serve" in help_run.stdout
    # the installed packages are the cache's files (linked, not copied): what the suite imports is shared
    package_init = next((venv / "lib").glob("python3*/site-packages/sqlalchemy/__init__.py"))
    assert package_init.stat().st_ino == (cache / package_init.relative_to(venv)).stat().st_ino
    # nothing of the cache (nor of this run's venv, linked to it) was written in place
    assert {p: p.read_bytes() for p in cached} == cached
    assert (VENV / "bin" / "grpo-curator").read_bytes() == own_script
    # make test's own install step has nothing left to do
    again = _make(clone, cache_home, "install-dev")
    assert again.returncode == 0 and "pip" not in again.stdout + again.stderr, again.stdout + again.stderr


def test_a_failed_editable_install_leaves_no_venv_to_be_taken_as_installed(fake_cache, clone, tmp_path):
    """The copy's stamps are the cache's, older than the clone's files: were the copy kept after its editable
    install failed (or was killed), ``make install-dev`` would find it installed and run the builder's code."""
    (clone / "pyproject.toml").write_text((clone / "pyproject.toml").read_text() + "\nnot toml = = =\n")
    cache = fake_cache(clone, tmp_path / "cache")
    run = _make(clone, tmp_path / "cache", "install-dev-cached")
    assert run.returncode != 0
    assert "the editable install into" in run.stderr and "failed" in run.stderr
    assert not (clone / ".venv").exists() and not (clone / ".venv.partial").exists()
    assert (cache / ".complete").exists()


def test_a_failed_build_stops_before_any_copy(clone, tmp_path):
    run = _make(clone, tmp_path / "cache", "install-dev-cached", "PY=false")  # the build's venv step fails
    assert run.returncode != 0 and "from " not in run.stdout
    assert not (clone / ".venv").exists() and not (clone / ".venv.partial").exists()
    assert not list((tmp_path / "cache" / "grpo-curator").glob("venv-dev-*/.complete"))


def test_a_cache_older_than_a_week_is_built_again(fake_cache, clone, tmp_path):
    cache = fake_cache(clone, tmp_path / "cache", "PY=false")
    os.utime(cache / ".complete", (time.time() - 7 * 86400 - 120,) * 2)  # 7 days and 2 minutes
    run = _make(clone, tmp_path / "cache", "install-dev-cached", "PY=false")
    assert "built more than 7 days ago: built again" in run.stdout
    assert run.returncode != 0 and not (cache / "bin" / "grpo-curator").exists()  # emptied, then PY=false


@pytest.mark.parametrize("name", ["with space", "r&d", "a#b"])
def test_a_path_the_scripts_could_not_name_gets_the_plain_install(tmp_path, name):
    src = tmp_path / name / "clone"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".venv.partial", ".git", "__pycache__", "*.egg-info", ".grpo-curator", ".hypothesis", ".ruff_cache",
        "tests", "docs", "bench"))
    run = _make(src, tmp_path / "cache", "install-dev-cached", "PY=false")  # the plain install: stops at once
    assert "could not name; the plain install instead" in run.stdout, run.stdout + run.stderr
    assert not (tmp_path / "cache" / "grpo-curator").exists() or not any((tmp_path / "cache" / "grpo-curator").iterdir())


def test_the_key_holds_what_decides_the_contents(clone, tmp_path):
    def key(*args: str, **env: str) -> str:
        e = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "MAKE", "PIP_"))}
        run = subprocess.run(["make", "-s", "-C", str(clone), "dev-cache-dir", *args], capture_output=True,
                             text=True, env=e | {"XDG_CACHE_HOME": str(tmp_path)} | env, timeout=60)
        return run.stdout.strip()

    base = key()
    variants = [key("TORCH_SPEC=torch==2.4.0"), key("TORCH_INDEX_URL=https://download.pytorch.org/whl/cu121"),
                key(PIP_CONSTRAINT="/tmp/c.txt"), key("PIP_INDEX_URL=http://example.invalid/simple"),
                key(f"PY={sys.executable}")]
    assert base.startswith(f"{tmp_path}/grpo-curator/venv-dev-")
    assert len({base, *variants}) == 6, variants
    assert key("VENV=elsewhere/.venv") == base  # where the clone's venv goes is no part of what it holds
    (clone / ".ci" / "dev-venv").write_text((clone / ".ci" / "dev-venv").read_text() + "\n# changed\n")
    assert key() != base


def test_a_clone_with_its_own_venv_keeps_it(fake_cache, clone, tmp_path):
    """A ``.venv`` already there (a developer's) is left to ``make install-dev``: nothing copied over or into it."""
    cache_home = tmp_path / "cache"
    cache = fake_cache(clone, cache_home)
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


def test_a_build_that_leaves_a_process_behind_does_not_hold_the_lock(clone, tmp_path):
    """Whatever the build starts and leaves running (a compiler server, an orphan of a killed run) must not hold
    the cache's lock: the next clone would wait on it without a word."""
    py = tmp_path / "py"
    py.write_text(f'#!/bin/sh\nif [ "$1" = -m ]; then (sleep 30) > /dev/null 2>&1 & exit 1; fi\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    first = _make(clone, tmp_path / "cache", "install-dev-cached", f"PY={py}")
    assert first.returncode != 0  # its venv step failed, leaving the sleep behind
    started = time.monotonic()
    second = _make(clone, tmp_path / "cache", "install-dev-cached", f"PY={py}")
    assert second.returncode != 0 and time.monotonic() - started < 10
    assert "waiting for" not in second.stdout


def test_a_symlinked_cache_home_and_a_symlinked_cache_are_followed_not_copied(fake_cache, clone, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "grpo-curator").symlink_to(real)  # the cache home is a link
    cache = fake_cache(clone, tmp_path / "cache")
    moved = real / "elsewhere"
    cache.rename(moved)  # and the key's own directory is a link too
    cache.symlink_to(moved)
    pip_before = (moved / "bin" / "pip").read_bytes()
    stamp_before = (moved / ".installed").stat()
    olds = [_other(real, str(n), complete=True, age_s=n * 10) for n in range(1, 5)]
    run = _make(clone, tmp_path / "cache", "install-dev-cached")
    assert run.returncode == 0, run.stdout + run.stderr
    venv = clone / ".venv"
    assert venv.is_dir() and not venv.is_symlink()
    assert (moved / "bin" / "pip").read_bytes() == pip_before and (moved / ".complete").exists()
    stamp = (moved / ".installed").stat()  # the clone's stamps are new files, not written through the link
    assert (stamp.st_ino, stamp.st_mtime_ns) == (stamp_before.st_ino, stamp_before.st_mtime_ns)
    assert (venv / ".installed").stat().st_ino != stamp.st_ino
    assert [o.exists() for o in olds] == [True, True, False, False]  # the 2 most recently built others stay


def test_two_runs_in_one_clone_take_turns(fake_cache, clone, tmp_path):
    fake_cache(clone, tmp_path / "cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "MAKE"))}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    runs = [subprocess.Popen(["make", "-s", "-C", str(clone), "install-dev-cached"], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [r.communicate(timeout=300)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outs
    assert sum("from " in o for o in outs) == 1 and sum(".venv exists" in o for o in outs) == 1, outs
    assert _python_of(clone / ".venv", "import service; print(service.__file__)") == str(clone / "service" / "__init__.py")


def test_a_venv_in_a_folder_not_yet_made(fake_cache, clone, tmp_path):
    fake_cache(clone, tmp_path / "cache")
    run = _make(clone, tmp_path / "cache", "install-dev-cached", "VENV=envs/ci/.venv")
    assert run.returncode == 0, run.stdout + run.stderr
    venv = clone / "envs" / "ci" / ".venv"
    assert _python_of(venv, "import service; print(service.__file__)") == str(clone / "service" / "__init__.py")
    assert (venv / ".installed-dev").exists()

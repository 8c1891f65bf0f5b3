"""The shape of the code: no import circle anywhere in the repository's packages, and nothing loose at
``service/``'s root (each module belongs to a domain folder, or to ``api/`` / ``store/`` plumbing)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "reward_models", "filters", "trainer", "rollout", "integrations", "migrations", "grpo_curator_integrations")
SERVICE_ROOT = {"__init__.py", "app.py", "settings.py", "client.py"}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages (a package is its ``__init__``)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The repository's modules that ``name`` imports, at any depth of the file (a function-level import
    closes a circle as surely as a top-level one: it only runs later)."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:  # from package import module
                    found.add(f"{base}.{alias.name}")
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (iterative depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_find_cycle_reports_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_any_package():
    known = module_files()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_nothing_is_loose_at_the_service_root():
    loose = sorted(p.name for p in (ROOT / "service").iterdir() if p.suffix == ".py" and p.name not in SERVICE_ROOT)
    assert not loose, f"modules loose at service/'s root (move each into its domain folder): {loose}"


def test_every_service_folder_is_a_package():
    folders = [p for p in (ROOT / "service").iterdir() if p.is_dir() and p.name not in {"__pycache__", "static"}]
    missing = sorted(p.name for p in folders if any(p.glob("*.py")) and not (p / "__init__.py").is_file())
    assert not missing, f"service folders without __init__.py: {missing}"


PLUMBING_BELOW = {"api", "store"}  # what every domain may use
PLUMBING_ABOVE = {"cli", "worker"}  # what uses the domains: never imported by one
# what another part of the service may import from a domain: its decisions and its wire types (and the
# process-wide Prometheus counters, which every stage increments)
DOMAIN_FACE = {"service", "schemas"}
SHARED = {"service.observability.metrics", "service.auth.keys"}  # auth's key management (create / list / revoke)


def layer_violations(known: dict[str, Path]) -> list[str]:
    """Imports that break the layering of service/ (docs/architecture.md, "The code"):
    - a domain uses another domain only through that domain's ``service.py`` (or its ``schemas.py`` types),
      and never the command line or the worker, which sit above the domains;
    - a repository imports no other domain at all (statements, not decisions);
    - the command line and the worker reach a domain the same way, through its ``service.py``;
    - ``store/`` (the bottom layer) imports nothing of the service but the settings."""
    bad = []
    for name, path in known.items():
        parts = name.split(".")
        if parts[0] != "service" or len(parts) < 3:
            continue
        here, module = parts[1], parts[-1]
        for target in sorted(imported(name, path, known)):
            tparts = target.split(".")
            if tparts[0] != "service" or len(tparts) < 2 or tparts[1] == here:
                continue
            there = tparts[1]
            if len(tparts) == 2:  # service.settings, service.client, a package
                continue
            if here == "store":
                bad.append(f"{name} imports {target} (store is the bottom layer)")
            elif there in PLUMBING_BELOW:
                continue
            elif there in PLUMBING_ABOVE:
                if here not in PLUMBING_ABOVE:
                    bad.append(f"{name} imports {target} (a domain never uses the {there})")
            elif module.endswith("repository"):
                bad.append(f"{name} imports {target} (a repository holds statements, not another domain)")
            elif tparts[2] not in DOMAIN_FACE and target not in SHARED:
                bad.append(f"{name} imports {target} (use service.{there}.service)")
    return bad


def test_layer_violations_are_found(tmp_path):
    files = {
        "service.a.repository": "from service.b import service\n",
        "service.b.service": "from service.api import errors\nfrom service.c import schemas\n",
        "service.b.repository": "",
        "service.c.service": "from service.b import repository\nfrom service.worker import pipeline\n",
        "service.c.schemas": "",
        "service.api.errors": "",
        "service.worker.pipeline": "from service.b import service\nfrom service.b import repository\n",
        "service.store.db": "from service.b import service\n",
    }
    known = {}
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
        known[name] = tmp_path / f"{name}.py"
    assert layer_violations(known) == [
        "service.a.repository imports service.b.service (a repository holds statements, not another domain)",
        "service.c.service imports service.b.repository (use service.b.service)",
        "service.c.service imports service.worker.pipeline (a domain never uses the worker)",
        "service.worker.pipeline imports service.b.repository (use service.b.service)",
        "service.store.db imports service.b.service (store is the bottom layer)",
    ]


def test_domains_meet_only_through_their_service_modules():
    assert layer_violations(module_files()) == []

"""docs/ says what the code does: every component kind and param, every policy field and default,
the built-in defaults, every request example; links resolve; nothing points outside the repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from filters.policy import CurationPolicySpec
from reward_models.registry import KINDS
from service.api.examples import EXTRA_EXAMPLES, REQUEST_EXAMPLES
from service.specs.service import DEFAULT_POLICY, DEFAULT_SPEC

DOCS = Path(__file__).resolve().parents[1] / "docs"
# addresses of the reader's own deployment (loopback, placeholders, private networks): not pointers outside
DEPLOYMENT_URL = r"https?://(127\.0\.0\.1|localhost|host|curator|api|db|judge|10\.\d+\.\d+\.\d+|192\.168\.\d+\.\d+)\b"
VALUES = {"https://download.pytorch.org/whl/cpu"}  # a setting's value (the Makefile's CPU torch index), not a link


def _json_blocks(name: str) -> list:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", (DOCS / name).read_text(), re.S)]


def _section(text: str, kind: str) -> str:
    start = text.index(f"### `{kind}`")
    end = text.find("\n### ", start + 1)
    return text[start : end if end > 0 else None]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_component_kind_and_param_is_documented(kind):
    section = _section((DOCS / "components.md").read_text(), kind)
    params = getattr(KINDS[kind], "Params", None)
    for name, field in (params.model_fields.items() if params else ()):
        assert f"`{field.alias or name}`" in section, f"{kind}: param {field.alias or name} undocumented"
    assert "Reads from the prompt" in section


def _fields(model, prefix=""):
    """Leaf field paths: `name`, `zero_variance.eps`, ..."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            yield from _fields(annotation, prefix + name + ".")
        else:
            yield prefix + name


def test_every_policy_field_and_default_is_documented():
    text = (DOCS / "curation.md").read_text()
    for field in _fields(CurationPolicySpec):
        assert f"`{field}`" in text, f"curation policy field {field} undocumented"
    assert _json_blocks("curation.md")[0] == CurationPolicySpec(name="my-policy").model_dump(mode="json")


def test_the_builtin_defaults_are_documented_as_they_are():
    spec, policy = _json_blocks("defaults.md")[:2]
    assert spec == DEFAULT_SPEC.model_dump(mode="json", exclude={"components": {0: {"params"}}})
    full = CurationPolicySpec.from_policy("default", DEFAULT_POLICY.to_policy())
    assert policy == full.model_dump(mode="json")


# the fields docs/api.md's copy-paste walk-through sends differently from /docs' example, each on purpose:
# the lease long-polls, so pasted right after the group posts it waits for the worker to score them
# (/docs' `wait_seconds: 0` answers 204 then, and the ack line after it has no batch id)
API_MD_DIFFERS = {("post", "/v1/batches/lease"): {"wait_seconds": 60}}


def test_api_md_shows_every_request_example():
    blocks = _json_blocks("api.md")
    for (method, path), (_summary, body) in REQUEST_EXAMPLES.items():
        body = body | API_MD_DIFFERS.get((method, path), {})
        assert body in blocks, f"docs/api.md lacks the example of {method.upper()} {path}"
        assert path in (DOCS / "api.md").read_text()
    for extra in EXTRA_EXAMPLES.values():
        for _summary, body in extra.values():
            assert body in blocks


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_links_resolve_and_stay_in_the_repository(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert not re.match(r"[a-z]+://", target), f"{page} links outside the repository: {target}"
        path = target.split("#")[0]
        assert (DOCS / path).is_file(), f"{page}: broken link {target}"
    for url in re.findall(r"https?://[^\s`)\"']+", text):
        assert re.match(DEPLOYMENT_URL, url) or url in VALUES, f"{page} points outside: {url}"


def test_the_index_lists_every_page():
    index = (DOCS / "README.md").read_text()
    for page in DOCS.glob("*.md"):
        assert page.name == "README.md" or f"]({page.name})" in index


# Attack: the README showed `serve --host 0.0.0.0` (refused without a key) and said nothing about keys.
def test_readme_has_the_security_section_and_no_open_non_loopback_serve() -> None:
    """Issue item 7: a short security section in the README (roles, creating keys, what is open without
    keys, the sandbox's threat model). README.md is untouched: no section, no word of keys, and it still
    shows `serve --host 0.0.0.0`, which now exits 2 unless a key exists."""
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    assert "keys create" in readme and "security" in readme.lower(), "README has no security section"
    for line in readme.splitlines():
        if "--host 0.0.0.0" in line:
            assert "key" in line.lower() or "insecure" in line, f"README shows a serve that now refuses: {line}"


# -- every shell command in README.md and docs/*.md runs as written ----------------------------------------
# The commands are written for a shell whose virtualenv is active (README: `source .venv/bin/activate`), so
# they run with this interpreter's bin directory first on the PATH, from the repository root, against a
# fresh database (DATABASE_URL) and, for the API walk-through, a real service (CURATOR, GRPO_CURATOR_URL).
# The few that cannot run here are marked, each with the reason.
CANNOT_RUN_HERE = {
    r"^make (serve|test)\b": "serves until stopped / runs the whole suite (serve: tests/service/cli)",
    r"grpo-curator serve\b": "serves until stopped (tests/service/cli/test_cli_frictions.py starts it)",
    r"grpo-curator score-worker\b": "runs until stopped (tests/service/worker/test_crash_recovery.py runs it)",
    r"^export [A-Z_]+=\S*(host|db|curator)[:/]": "names a host of your deployment (a placeholder)",
    r"<[a-z ]+>": "carries a placeholder to fill in (<producer key>, <key>)",
    r"^grpo-curator rollout\b|^torchrun\b": "needs a model checkpoint and GPUs of your deployment",
    r"^python -m (verl|openrlhf)\b": "another project's trainer (verl / OpenRLHF), not installed here",
    r"^docker compose\b": "needs Docker (tests/test_compose.py checks the compose file)",
    r"--url http://curator:|^curl 'http://curator:": "names a host of your deployment (a placeholder)",
    r"^grpo-curator infer\b": "serves until stopped (`python -m rollout.agent_example --local` starts it)",
    r"rollout\.agent_example --url\b": "talks to the servers started by hand in the lines above (--local runs them)",
    r"python -m sglang\b": "the inference server of a GPU host (SGLang, not installed here)",
    r"python -m bench\.scale\b": "a scale benchmark of minutes (100,000s of groups; tests/bench run it small)",
    r"python -m bench\.chaos\b": "minutes of kill -9 cycles of the API, worker and PostgreSQL (tests/test_chaos.py)",
    r"^grpo-curator archive --to (s3://|'s3://|/data/)": "an archive target of your deployment: an S3 bucket, a "
    "/data volume (tests/service/archive run archive against a local folder)",
}
# lines of ``` / ```text blocks that start with one of these are commands too (the rest is shown output)
COMMAND_WORDS = r"([A-Z_]+=\S+ )*(nice -n \d+ )?(grpo-curator|make|python|curl|source|\.venv/bin/)"
ROOT_DIR = DOCS.parent
SHELL_PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))]


def _commands(page: str) -> list[tuple[str, str]]:
    """(command, the JSON body just above its block) of every ```bash / ```sh block of ``page``, and the lines of
    its ``` / ```text blocks that start with a command (``COMMAND_WORDS``): lines joined across trailing
    backslashes, comments and blank lines left out."""
    text = (ROOT_DIR / page).read_text()
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M):  # every block, opening and closing fence
        if m.group(1) not in ("bash", "sh", "", "text"):
            continue
        before = text[: m.start()]
        body = re.findall(r"```json\n(.*?)```\n$", before[before.rfind("```json"):], re.S)
        pending = ""
        for line in re.sub(r"\\\n\s*", " ", m.group(2)).splitlines():
            if m.group(1) in ("", "text") and not pending and not re.match(COMMAND_WORDS, line):
                continue  # output shown beside the commands
            pending = f"{pending}\n{line}" if pending else line
            if pending.count("'") % 2:  # a quoted value spans lines: the command goes on
                continue
            command = re.sub(r"\s+#\s[^'\"]*$", "", pending).strip()
            pending = ""
            if command and not command.startswith("#"):
                out.append((command, body[0] if body else ""))
    return out


def _cannot(command: str) -> str | None:
    return next((why for pattern, why in CANNOT_RUN_HERE.items() if re.search(pattern, command)), None)


def test_every_page_with_shell_commands_is_checked():
    assert {p for p in SHELL_PAGES if _commands(p)} >= {"README.md", "docs/api.md", "docs/security.md"}


def _run(command: str, cwd: Path, env: dict[str, str]) -> None:
    import subprocess

    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    return proc


def _shell_env(**extra: str) -> dict[str, str]:
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_CURATOR_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the active virtualenv
    env["PYTHONPATH"] = str(ROOT_DIR)  # this checkout, whatever tree the virtualenv was installed from
    return env | extra


# Commands that talk to no running service, each with the reason: a page whose runnable commands all match one
# of these runs without the live service (a start is seconds of CPU: 4 of the 5 pages need none). Any other
# command gets a real service at GRPO_CURATOR_URL; without one, GRPO_CURATOR_URL names an address where nothing
# listens, so a command misfiled here that does talk to a service fails (connection refused), never passes.
NEEDS_NO_SERVICE = {
    r"^source \.venv/bin/activate$": "activates the virtualenv",
    r"^(\.venv/bin/)?grpo-curator (migrate|keys)\b": "works on the database itself (DATABASE_URL), not through a service",
    r"^python -m rollout\.agent_example --local\b": "starts its own `serve` and `infer --tiny` (--local)",
    r"^DATABASE_URL=\S+ python -m bench\.prompt_dedup$": "the app in-process, on databases of its own",
}
NO_SERVICE_URL = "http://127.0.0.1:1"  # nothing listens on port 1: connection refused


def _needs_service(command: str) -> bool:
    return not any(re.search(pattern, command) for pattern in NEEDS_NO_SERVICE)


@pytest.mark.parametrize("page", [p for p in SHELL_PAGES if p != "docs/api.md" and _commands(p)])
def test_shell_commands_run_as_written(page, fresh_db, tmp_path):
    """Each command that can run here exits 0 (one shell each, in page order, on the page's own database), with
    a real service at GRPO_CURATOR_URL when one of the page's commands may talk to one (``NEEDS_NO_SERVICE``)."""
    from tests.conftest import start_server, stop_server

    runnable = [command for command, _ in _commands(page) if _cannot(command) is None]
    server = start_server(fresh_db) if any(_needs_service(c) for c in runnable) else None
    try:
        env = _shell_env(DATABASE_URL=fresh_db, GRPO_CURATOR_URL=server.url if server else NO_SERVICE_URL)
        (tmp_path / "prompts.jsonl").write_text(
            '{"id": "doc-p1", "dataset": "toy", "messages": [{"role": "user", "content": "6 * 7?"}],'
            ' "reference": {"answer": "42"}}\n')
        for command in runnable:
            # the repository's relative paths (.venv/bin/...) from its root; files a command reads from tmp_path
            _run(command, ROOT_DIR if ".venv" in command or "keys" in command else tmp_path, env)
    finally:
        if server is not None:
            stop_server(server)
    assert runnable or all(_cannot(c) for c, _ in _commands(page))



def test_api_md_curl_lines_run_in_order_against_a_real_service(fresh_db, tmp_path):
    """docs/api.md's walk-through, pasted in order as a user would against `make serve`: each curl line sends
    the body above it (saved under the file name it names) with the Content-Type header, and the service
    accepts it. Nothing scores between the lines but the service's own in-process worker (as `make serve`
    runs it): the lease line's long poll waits for it, and the `export BATCH_ID=$(...)` line after it takes
    the batch id from what the lease printed, as in a user's shell."""
    from tests.conftest import start_server, stop_server

    server = start_server(fresh_db, env={"GRPO_CURATOR_EMBEDDED_WORKER": "true"})
    try:
        env = _shell_env(CURATOR=server.url)
        commands = _commands("docs/api.md")
        assert all("Content-Type: application/json" in c for c, _ in commands if "--data" in c)
        assert any(re.match(r"export BATCH_ID=\$\(", c) for c, _ in commands)
        lease = None
        for command, body in commands:
            assert _cannot(command) is None, command
            if "--data @" in command:
                (tmp_path / re.search(r"--data @(\S+)", command).group(1)).write_text(body)
            exported = re.match(r"export ([A-Z_]+)=\$\(", command)
            if exported:  # each line runs in its own shell here: carry what it exports to the next ones
                name = exported.group(1)
                env[name] = _run(f'{command} && printf %s "${name}"', tmp_path, env).stdout
                assert env[name], command
                continue
            proc = _run(command, tmp_path, env)
            if "/v1/batches/lease" in command:
                lease = json.loads(proc.stdout)
        assert lease is not None and lease["batch_id"] == env["BATCH_ID"]
        # what the page says of its group: the `length` member (4 tokens of max_tokens 1024) is a cut, so
        # `penalize` gives it the full -1: the wrong `stop` answer's stored reward, the lowest advantage
        leased = {g["id"]: g for g in lease["groups"]}
        group = leased["run7-step12-gsm8k-17"]["trajectories"]
        by_index = {t["index"]: t for t in group}
        assert by_index[3]["total_reward"] == by_index[1]["total_reward"]
        assert by_index[3]["advantage"] < by_index[1]["advantage"] < 0 < by_index[0]["advantage"]
    finally:
        stop_server(server)


def test_marked_commands_say_why():
    marked = {(p, c): _cannot(c) for p in SHELL_PAGES for c, _ in _commands(p) if _cannot(c)}
    assert marked and all(why for why in marked.values())


# Attack: `grpo-curator --help` listed `infer`; docs/README.md's table, README's CLI line and the top-level
# --help description left it out (the description named an old subset: serve ... stats).
def test_every_cli_command_is_in_the_help_description_and_the_docs():
    from service.cli.main import build_parser
    from tests.conftest import ROOT

    parser = build_parser()
    commands = list(next(a for a in parser._actions if a.choices and "serve" in a.choices).choices)
    assert "infer" in commands and "keys" in commands
    description = " ".join(parser.description.split())
    table = (DOCS / "README.md").read_text()
    cli_line = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("CLI: "))
    for command in commands:
        assert f" {command}," in description or f" {command}." in description, f"--help leaves out {command}"
        assert f"| `grpo-curator {command}" in table, f"docs/README.md's command table leaves out {command}"
        assert f"`{command}`" in cli_line, f"README's CLI line leaves out {command}"

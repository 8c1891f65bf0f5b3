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


def test_api_md_shows_every_request_example():
    blocks = _json_blocks("api.md")
    for (method, path), (_summary, body) in REQUEST_EXAMPLES.items():
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

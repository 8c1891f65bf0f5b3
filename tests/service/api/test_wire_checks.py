"""The request guard's JSON checks (service.api.wire_checks) against the stdlib parser as the reference:
the fast path may never accept what the exact path refuses, nor change a document."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.api.wire_checks import (
    INT64_MAX,
    INT64_MIN,
    WireError,
    _suspicious,
    check_content_type,
    parse_json_body,
)

text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
scalars = st.none() | st.booleans() | st.integers(INT64_MIN, INT64_MAX) | st.floats(allow_nan=False, allow_infinity=False) | text
docs = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=5), max_leaves=30)


def _spellings(doc: Any) -> list[bytes]:
    """The same document as different producers write it."""
    return [json.dumps(doc).encode(), json.dumps(doc, ensure_ascii=False).encode(),
            json.dumps(doc, indent=2, separators=(" , ", " : ")).encode()]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(docs)
def test_valid_documents_come_back_unchanged(doc):
    for raw in _spellings(doc):
        assert parse_json_body(raw) == json.loads(raw)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(docs, text, st.data())
def test_a_repeated_key_is_always_found(doc, key, data):
    """Wrap ``doc`` so some object repeats ``key``; whatever the spelling, the fast path must notice."""
    inner = json.dumps(doc)
    depth = data.draw(st.integers(0, 3))
    raw = f'{{{json.dumps(key)}: 1, "x": {inner}, {json.dumps(key)}: 2}}'
    for _ in range(depth):
        raw = f'{{"wrap": [{raw}], "pad": "\\":"}}'
    with pytest.raises(WireError) as err:
        parse_json_body(raw.encode())
    assert err.value.status == 400 and err.value.message.startswith("duplicate key")
    assert err.value.field.endswith(key) or key == ""


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"a": [0, 9223372036854775808]}', "a[1]"),
        (b'{"a": -9223372036854775809}', "a"),
        (b'{"a": 18446744073709551615}', "a"),  # fits u64, which orjson would take: still refused
        (b'{"a": {"b": 1e309}}', "a.b"),
        (b'{"a": [NaN]}', "a[0]"),
        (b'{"a": "x\\u0000"}', "a"),
        (b'{"a": "\\udc00"}', "a"),
        (b'{"a": 1' + b"0" * 5000 + b"}", "body"),
    ],
)
def test_unstorable_values_name_their_field(raw, field):
    with pytest.raises(WireError) as err:
        parse_json_body(raw)
    assert (err.value.status, err.value.field) == (422, field)


def test_edges_that_are_fine():
    assert parse_json_body(b'{"a": [9223372036854775807, -9223372036854775808, 1e308, 1e-400]}') == {
        "a": [INT64_MAX, INT64_MIN, 1e308, 0.0]
    }
    assert parse_json_body(b'{"k": "\\ud83d\\ude00 \\":\\" \\\\"}') == {"k": '\U0001f600 ":" \\'}


@pytest.mark.parametrize("value", [None, "", "text/plain", "application/jsonx", "multipart/form-data"])
def test_content_types_refused(value):
    with pytest.raises(WireError) as err:
        check_content_type(value)
    assert err.value.status == 415


@pytest.mark.parametrize("value", ["application/json", "Application/JSON; charset=utf-8"])
def test_content_types_accepted(value):
    check_content_type(value)


def test_long_fractions_take_the_fast_path_and_long_integers_beside_them_are_still_caught():
    """Log-probs near 0 are written with up to 20 fraction digits (repr(-0.00012345678901234567)): they fit a
    double, so they must not send a body down the exact path (~16x slower); a 19-digit integer part,
    anywhere beside them, still must."""
    fractions = [-0.00012345678901234567, -0.0009876543210987654, 0.1234567890123456789, -1.2345678901234567e-05]
    assert any(len(r.split(".")[1]) >= 19 for r in map(repr, fractions))  # the shape this guards
    doc = {"logprobs": fractions * 50, "token_ids": list(range(100))}
    raw = json.dumps(doc).encode()
    assert not _suspicious(raw)
    assert parse_json_body(raw) == doc
    for bad, field in ((9223372036854775808, "token_ids[100]"), (-9223372036854775809, "token_ids[100]")):
        body = json.dumps({**doc, "token_ids": [*doc["token_ids"], bad]}).encode()
        assert _suspicious(body)
        with pytest.raises(WireError) as err:
            parse_json_body(body)
        assert (err.value.status, err.value.field) == (422, field)
    # a float whose integer part is 19+ digits long is still looked at (and is fine: a finite double)
    big = raw[:-1] + b', "x": 12345678901234567890.5}'
    assert _suspicious(big) and parse_json_body(big)["x"] == 12345678901234567890.5
    # an integer right after a fraction's digits (".5,1234...") is not a fraction
    assert _suspicious(b'{"a": [0.00000000000000000001,12345678901234567890]}')
    # a fraction's run is skipped to its end, however long (a search from inside it would see a run that
    # does not follow a '.'), and the next number is still looked at; a bare number at the body's start too
    long_fraction = b"0." + b"1234567890" * 5
    assert not _suspicious(b"[" + long_fraction + b"," + long_fraction + b"]")
    assert _suspicious(b"[" + long_fraction + b",-1234567890123456789]")
    assert _suspicious(b"1234567890123456789") and not _suspicious(b"123456789012345678")
    # whatever comes right before an integer part (a sign, '[', ',', ':', JSON whitespace), and an exponent's sign
    for before in (b"-", b"[", b", ", b":", b": -", b"\n", b"\t", b"\r\n  "):
        assert _suspicious(b'{"a":[1,' + before + b'9223372036854775808]}'), before
    for exponent in (b"1e-000", b"1E+0001", b"2.5e000"):
        assert _suspicious(b"[" + exponent + b"]"), exponent
    assert not _suspicious(b"[-0.0000000000000000000001, 1e-05, 0.5e+10]")


@pytest.mark.parametrize("exact", [False, True], ids=["fast-path", "exact-path"])
@pytest.mark.parametrize("shape", ["[", '{"k": '])
def test_depth_limit_names_the_field_on_both_paths(exact, shape):
    """MAX_DEPTH levels pass; one more is a 422 naming the first container beyond the limit. A NUL
    escape elsewhere sends the body down the exact (stdlib) path, which must apply the same limit."""
    from service.api.wire_checks import MAX_DEPTH

    close = "]" if shape == "[" else "}"
    step = "[0]" if shape == "[" else ".k"

    def body(levels: int) -> bytes:  # ``levels`` nested containers inside {"a": ..., "z": ...}
        inner = shape * levels + "1" + close * levels
        return ('{"z": "%s", "a": %s}' % ("\\u0000" if exact else "", inner)).encode()  # noqa: UP031

    if exact:
        with pytest.raises(WireError) as nul:
            parse_json_body(body(MAX_DEPTH - 1))
        assert nul.value.field == "z"  # within the limit: the NUL is what is reported
    else:
        assert parse_json_body(body(MAX_DEPTH - 1))["z"] == ""
    with pytest.raises(WireError) as deep:
        parse_json_body(body(MAX_DEPTH))
    # the body is level 1, "a" level 2: the innermost of MAX_DEPTH containers is the first one too deep
    assert (deep.value.status, deep.value.field) == (422, "a" + step * (MAX_DEPTH - 1))


@pytest.mark.parametrize("where", [0, 512, 1024])
@pytest.mark.parametrize("numbers", [list(range(1024)), [-0.5 - i / 3 for i in range(1024)], ([True, 1, 2.5] * 342)[:1024]])
def test_a_container_among_a_token_arrays_numbers_is_still_walked(numbers, where):
    """The key count skips a list of numbers without looking at its items one by one (``sum`` in C): an
    object or an array at its start, middle or end is still counted (a repeated key inside is found) and
    its depth still checked, and a list of numbers with strings or nulls among them parses unchanged."""
    from service.api.wire_checks import MAX_DEPTH

    def with_item(item: str) -> bytes:
        items = [json.dumps(v) for v in numbers]
        items.insert(where, item)
        return ('{"token_ids": [%s]}' % ",".join(items)).encode()  # noqa: UP031

    with pytest.raises(WireError) as dup:
        parse_json_body(with_item('{"a": 1, "a": 2}'))
    assert (dup.value.status, dup.value.field) == (400, f"token_ids[{where}].a")
    with pytest.raises(WireError) as deep:
        parse_json_body(with_item("[" * MAX_DEPTH + "]" * MAX_DEPTH))
    assert deep.value.status == 422 and deep.value.field.startswith(f"token_ids[{where}]")
    for item in ('"x"', "null", "[]", "{}"):
        raw = with_item(item)
        assert parse_json_body(raw) == json.loads(raw)

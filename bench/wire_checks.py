"""What the request guard costs on ingest bodies: parse + check + strict validation of ``POST /v1/groups``
bodies, against validating the same bytes straight with pydantic-core (no duplicate-key, NUL or
64-bit checks), measured side by side in one run; and the guard's parse + checks on a hostile body (the same
size, nothing but 19-digit fractions: the most work for its integer search, which runs before authentication)
against orjson's parse of it. No database: this is the CPU the API process spends.

    python -m bench.wire_checks [--groups 32] [--n 8] [--tokens 1024] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson
from pydantic import TypeAdapter

from service.api.wire_checks import parse_json_body
from service.ingest.body import _validate
from service.ingest.schemas import GroupsIn
from tests.helpers import make_group


def _body(groups: int, n: int, tokens: int) -> bytes:
    body = {"groups": [make_group(f"b-{i}", prompt_id=f"p-{i}", n=n) for i in range(groups)]}
    for g in body["groups"]:
        for t in g["trajectories"]:
            t["token_ids"] = list(range(1, tokens + 1))
            t["loss_mask"] = [0] * (tokens // 4) + [1] * (tokens - tokens // 4)
            t["logprobs"] = [-0.25] * tokens
            t["metadata"] = {"env": "bench", "note": "ünïcode \U0001f600 text"}
    return orjson.dumps(body)


def _time(fn: Callable[[], object], repeat: int) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    raw = _body(args.groups, args.n, args.tokens)
    lax = TypeAdapter(GroupsIn)
    baseline = _time(lambda: lax.validate_json(raw), args.repeat)
    checked = _time(lambda: _validate(parse_json_body(raw)), args.repeat)
    parse_only = _time(lambda: parse_json_body(raw), args.repeat)
    print(f"body: {len(raw) / 1e6:.2f} MB ({args.groups} groups x {args.n} x {args.tokens} tokens)")
    print(f"pydantic validate_json (no wire checks): {baseline * 1e3:8.1f} ms")
    print(f"wire checks + strict validation:         {checked * 1e3:8.1f} ms  ({checked / baseline:.2f}x)")
    print(f"  of which parse + checks:               {parse_only * 1e3:8.1f} ms")
    # hostile bodies: what a byte scan looks at longest (19-digit fractions), and what the key count walks most
    # (a container each few bytes: the bound is max_body_containers)
    hostile = {
        "19-digit fractions": b"[" + b",".join([b"0.1234567890123456789"] * (len(raw) // 22)) + b"]",
        "short lists [null]": b"[" + b",".join([b"[null]"] * (len(raw) // 7)) + b"]",
    }
    for name, body in hostile.items():
        parse = _time(lambda body=body: orjson.loads(body), args.repeat)
        guarded = _time(lambda body=body: parse_json_body(body), args.repeat)
        print(f"hostile body ({len(body) / 1e6:.2f} MB of {name}): orjson {parse * 1e3:.1f} ms, "
              f"parse + checks {guarded * 1e3:.1f} ms ({guarded / parse:.2f}x)")


if __name__ == "__main__":
    main()

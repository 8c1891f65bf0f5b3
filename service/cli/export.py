"""``grpo-curator export``: SFT / DPO / KTO / rollout datasets out of the store, through ``GET /v1/export``.

grpo-curator export --format sft --out sft.parquet --dataset gsm8k --min-policy-version 10
grpo-curator export --format rollouts --out all.jsonl --status ready --status consumed

The answer is streamed into FILE.part and renamed to FILE when complete.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from service.cli.connection import add_client_options, api_key, http_client, redact, service_url, unreachable
from service.cli.errors import ServiceAnswered

# GET /v1/export's formats (service.export.schemas.EXPORT_FORMATS, equal by test): the command talks HTTP, and
# the server's schemas import FastAPI, numpy and every reward component
EXPORT_FORMATS: tuple[str, ...] = ("sft", "dpo", "kto", "rollouts", "verl")


def export_to(client: httpx.Client, params: dict[str, Any], out: Path) -> int:
    """Stream ``GET /v1/export`` into ``out`` (via ``out.part``); returns the number of rows written."""
    filetype = "parquet" if out.suffix == ".parquet" else "jsonl"
    part = out.with_name(out.name + ".part")
    lines = 0
    try:
        with client.stream("GET", "/v1/export", params={**params, "filetype": filetype}) as r:
            if r.status_code != 200:
                r.read()
                raise ServiceAnswered.of(r)
            with part.open("wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
                    lines += chunk.count(b"\n")
    except BaseException:
        part.unlink(missing_ok=True)  # an interrupted export leaves no file that looks complete
        raise
    part.replace(out)
    if filetype == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(out).metadata.num_rows
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grpo-curator export", description="export SFT / DPO / KTO / rollout data")
    ap.add_argument("--format", choices=EXPORT_FORMATS, required=True)
    ap.add_argument("--out", type=Path, required=True, help="FILE.parquet or FILE.jsonl")
    add_client_options(ap)
    ap.add_argument("--dataset")
    ap.add_argument("--min-policy-version", type=int)
    ap.add_argument("--max-policy-version", type=int)
    ap.add_argument("--status", action="append", help="group status (repeat); default: every scored one")
    ap.add_argument("--min-reward", type=float)
    ap.add_argument("--correct-threshold", type=float)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--tool-arguments", choices=["object", "string"],
                    help="tool-call arguments as JSON objects (default; what TRL's chat templates need) or as text")
    ap.add_argument("--include-archived", action="store_true", default=None,
                    help="also the archived groups (grpo-curator archive), read back from their Parquet files")
    args = ap.parse_args(argv)
    if args.out.suffix not in (".parquet", ".jsonl"):
        print("error: --out: must end in .parquet or .jsonl", file=sys.stderr)
        return 1
    names = ("format", "dataset", "min_policy_version", "max_policy_version", "status", "min_reward",
             "correct_threshold", "limit", "tool_arguments", "include_archived")
    params = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    url = service_url(args)
    try:
        with http_client(url, api_key(args)) as client:
            rows = export_to(client, params, args.out)
    except httpx.TransportError as exc:
        print(f"error: {unreachable(url, exc)}", file=sys.stderr)
        return 1
    except (RuntimeError, httpx.HTTPError, OSError) as exc:
        print(redact(f"error: {exc}", args), file=sys.stderr)
        return 1
    print(f"wrote {rows} {args.format} rows to {args.out}")
    return 0

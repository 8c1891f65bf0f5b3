"""``grpo-curator stats``: the reward statistics of ``GET /v1/stats`` printed as a table.

grpo-curator stats --by policy_version --dataset gsm8k --since 2026-11-30T00:00
grpo-curator stats --by component --json
grpo-curator stats --rebuild          # recompute the rollup first (POST /v1/stats/rebuild)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from service.cli.alerts_lines import format_alerts, open_alerts
from service.cli.connection import add_client_options, api_key, redact, service_url, unreachable
from service.cli.errors import ServiceAnswered
from service.client import CuratorClient, CuratorError

# GET /v1/stats's ``by`` (service.stats.service.STATS_BY, equal by test): the command talks HTTP, and importing
# the server's stats module would load SQLAlchemy, FastAPI and numpy into every `stats` run
STATS_BY: tuple[str, ...] = ("policy_version", "dataset", "component", "finish_reason")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-curator stats", description=__doc__.splitlines()[0])
    add_client_options(parser)
    parser.add_argument("--by", default="dataset", choices=STATS_BY)
    parser.add_argument("--dataset", help="only this dataset")
    parser.add_argument("--since", help="ISO time; applied at hour granularity (UTC)")
    parser.add_argument(
        "--rebuild", action="store_true", help="recompute the rollup from the stored groups first"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON answer instead of a table")
    return parser


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if abs(value) >= 1e4 else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _breakdown(label: str, fractions: dict[str, float]) -> str:
    return f"{label} " + ", ".join(f"{k}={_pct(v)}" for k, v in fractions.items()) if fractions else ""


def _row(row: dict[str, Any]) -> list[str]:
    t, length = row["total"], row["length"]
    components = " ".join(f"{name}={_num(c['mean'])}" for name, c in row["components"].items())
    details = "; ".join(
        s
        for s in (
            _breakdown("drop", row["drop_fraction"]),
            _breakdown("trunc", row["truncation_rate"]),
            components,
        )
        if s
    )
    return [
        str(row["key"]),
        str(row["count"]),
        _num(t["mean"]),
        _num(t["std"]),
        _num(t["p10"]),
        _num(t["p50"]),
        _num(t["p90"]),
        _pct(row["pass_rate"]),
        _pct(row["zero_variance_fraction"]),
        _pct(sum(row["drop_fraction"].values())),
        _pct(sum(row["truncation_rate"].values())),
        _num(length["mean"], 1),
        _num(length["p90"], 1),
        _num(row["length_reward_corr"], 2),
        details,
    ]


_HEADER = [
    "key",
    "n",
    "mean",
    "std",
    "p10",
    "p50",
    "p90",
    "pass",
    "zero-var",
    "drop",
    "trunc",
    "len",
    "len p90",
    "len~r",
    "details",
]
_COMPONENT_HEADER = ["component", "n", "mean", "std", "p10", "p50", "p90", "errors", "len~r"]


def _component_row(row: dict[str, Any]) -> list[str]:
    return [
        str(row["key"]),
        str(row["count"]),
        _num(row["mean"]),
        _num(row["std"]),
        _num(row["p10"]),
        _num(row["p50"]),
        _num(row["p90"]),
        _pct(row["error_rate"]),
        _num(row["length_reward_corr"], 2),
    ]


def format_table(body: dict[str, Any]) -> str:
    """The answer of GET /v1/stats as aligned text columns (quantiles are approximate, within 2 %)."""
    header, make = (_COMPONENT_HEADER, _component_row) if body["by"] == "component" else (_HEADER, _row)
    lines = [header, *(make(r) for r in body["rows"])]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = [
        "  ".join(
            [
                *(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(line, widths, strict=False))
                ),
                line[-1],
            ]
        ).rstrip()
        for line in lines
    ]
    scope = (
        f"by {body['by']}"
        + (f", dataset {body['dataset']}" if body.get("dataset") else "")
        + (f", since {body['since']}" if body.get("since") else "")
    )
    return "\n".join([f"reward statistics {scope}: {len(body['rows'])} rows", *out])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    params = {k: v for k, v in (("by", args.by), ("dataset", args.dataset), ("since", args.since)) if v}
    url = service_url(args)
    try:
        with CuratorClient(url, api_key=api_key(args)) as client:
            if args.rebuild:
                done = client._json("POST", "/v1/stats/rebuild")
                print(
                    f"rebuilt the rollup: {done['groups']} groups in {done['cells']} cells", file=sys.stderr
                )
            body = client._json("GET", "/v1/stats", params=params)
            alerts = None if args.json else open_alerts(client)
    except CuratorError as exc:
        print(redact(f"error: {ServiceAnswered(None, url, exc.status_code, exc.message)}", args), file=sys.stderr)
        return 1
    except httpx.TransportError as exc:
        print(f"error: {unreachable(url, exc)}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(redact(f"error: {url}: {exc}", args), file=sys.stderr)
        return 1
    print(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() if args.json else format_table(body))
    if alerts is not None:
        print(format_alerts(alerts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

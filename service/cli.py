"""The ``grpo-curator`` command line: serve, migrate, score-worker, train, rollout, demo, stats."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from service.settings import get_settings


def cmd_migrate(args: argparse.Namespace) -> int:
    from service.db import resolve_database_url
    from service.migrate import downgrade, upgrade

    url = resolve_database_url()
    if args.downgrade:
        downgrade(url, args.downgrade)
    else:
        upgrade(url, args.revision)
    print(f"migrated {'down to ' + args.downgrade if args.downgrade else 'to ' + args.revision}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.db import resolve_database_url
    from service.migrate import upgrade

    settings = get_settings()
    url = resolve_database_url(settings)
    upgrade(url)
    # workers (and any process the service starts) reuse the resolved server instead of starting their own
    os.environ["DATABASE_URL"] = url
    get_settings.cache_clear()
    host = args.host or settings.host
    port = args.port or settings.port
    workers = args.workers or settings.workers
    print(f"grpo-curator serving on http://{host}:{port} (docs at /docs, dashboard at /dashboard)", flush=True)
    uvicorn.run(
        "service.app:create_served_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level,
    )
    return 0


LATER = {
    "score-worker": ("service.workers.main", "score / curate worker: claims received groups, scores and curates them"),
    "train": ("trainer.cli", "GRPO trainer: lease -> train -> ack -> publish"),
    "rollout": ("rollout.producer", "rollout producer: sample groups and post them"),
    "demo": ("rollout.demo", "the whole loop on a tiny model, embedded PostgreSQL"),
    "stats": ("service.stats_cli", "print reward statistics as a table"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-curator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the API (and an in-process worker); migrates to head first")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int)
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("migrate", help="alembic upgrade head (or --downgrade REV)")
    p.add_argument("--revision", default="head")
    p.add_argument("--downgrade")
    p.set_defaults(func=cmd_migrate)
    for name, (_module, help_text) in LATER.items():  # dispatched in main(); listed here for --help
        sub.add_parser(name, help=help_text + f" (grpo-curator {name} --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in LATER:  # these parse their own options (argparse's REMAINDER drops leading --flags)
        import importlib

        return int(importlib.import_module(LATER[argv[0]][0]).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

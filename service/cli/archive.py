"""``grpo-curator archive``: move finished groups older than a duration from PostgreSQL to Parquet files.

grpo-curator archive --to /data/archive --older-than 7d
grpo-curator archive --to s3://bucket/grpo --older-than 0s

Talks to the database directly (DATABASE_URL, or the embedded PostgreSQL), like ``migrate``. S3 credentials
come from the usual AWS variables; pyarrow's S3 options may follow the URL as a query
(``s3://bucket/prefix?endpoint_override=host:9000&scheme=http``). See docs/operations.md, "Archive".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from service.settings import get_settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = get_settings()
    ap = argparse.ArgumentParser(prog="grpo-curator archive", description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", default=settings.archive_url,
                    help="a directory or s3://bucket/prefix (default: GRPO_CURATOR_ARCHIVE_URL)")
    ap.add_argument("--older-than", default=settings.retention,
                    help=f"archive groups created longer ago than this: 0s, 12h, 7d, 2w (default: {settings.retention}, "
                         "GRPO_CURATOR_RETENTION)")
    ap.add_argument("--batch", type=int, default=settings.archive_batch_groups, help="groups per file batch")
    args = ap.parse_args(argv)
    if not args.to:
        print("error: --to: required (a directory or s3://bucket/prefix), or set GRPO_CURATOR_ARCHIVE_URL",
              file=sys.stderr)
        return 2
    if args.batch < 1:
        print("error: --batch: must be at least 1", file=sys.stderr)
        return 2
    from service.archive import service as archive  # SQLAlchemy, pyarrow: not for --help or a bad option

    try:
        older_than = archive.parse_duration(args.older_than)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from service.store.db import get_engine, resolve_database_url
    from service.store.migrate import upgrade

    url = resolve_database_url(settings)
    upgrade(url)
    print(f"archiving to {args.to} (older than {args.older_than})", flush=True)
    try:
        result = archive.archive(get_engine(url), args.to, older_than, batch_groups=args.batch)
    except archive.ArchiverBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"archived {result.groups} groups ({result.trajectories} trajectories) into {result.files} files"
          + (f"; removed {result.orphans_removed} unrecorded files" if result.orphans_removed else "")
          + (f"; {result.skipped} groups changed while read, left hot for the next run" if result.skipped else ""))
    return 0

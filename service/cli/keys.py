"""``grpo-curator keys create|list|revoke``: API keys, straight in the database (DATABASE_URL, or the
embedded PostgreSQL in GRPO_CURATOR_DATA_DIR). ``create`` prints the token on its last line, once."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

# the roles of service.auth.service.Role (equal by test), so `keys --help` and a bad --role need no database code
ROLES = ("producer", "trainer", "viewer", "admin")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-curator keys", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("create", help="create a key; its token is printed once, on the last line")
    p.add_argument("--role", required=True, choices=list(ROLES))
    p.add_argument("--name", required=True, help="a unique name, recorded on what the key writes")
    p.add_argument("--dataset", action="extend", nargs="+", help="scope the key to these datasets (repeatable)")
    sub.add_parser("list", help="list keys (never their tokens)").add_argument("--json", action="store_true")
    sub.add_parser("revoke", help="revoke a key by name").add_argument("name")
    return parser


def _run(args: argparse.Namespace) -> None:
    from service.auth import keys
    from service.store.db import get_engine, make_sessionmaker, resolve_database_url
    from service.store.migrate import upgrade

    url = resolve_database_url()
    upgrade(url)
    with make_sessionmaker(get_engine(url)).begin() as session:
        if args.action == "create":
            token = keys.create_key(session, args.name, args.role, args.dataset)
            scope = ", ".join(sorted(set(args.dataset))) if args.dataset else "every dataset"
            print(f"created {args.role} key {args.name!r} ({scope}); the token is shown only now:")
            print(token)
        elif args.action == "list":
            rows = keys.list_keys(session)
            if args.json:
                print(json.dumps(rows, indent=2))
            for r in [] if args.json else rows:
                state = f"revoked {r['revoked_at']}" if r["revoked_at"] else "active"
                print(f"{r['name']:<24} {r['role']:<9} {','.join(r['datasets'] or ['*']):<24} {state}")
        else:
            keys.revoke_key(session, args.name)
            print(f"revoked {args.name!r}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from service.api.errors import ServiceError

    try:
        _run(args)
    except ServiceError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 0

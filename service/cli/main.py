"""The ``grpo-curator`` command line (its commands: `build_parser`, the one list, shown by ``--help``)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys

from service.cli.errors import CommandFailed, check_set_options, explain, missing_extra
from service.settings import LOG_LEVEL_ALIASES, LOG_LEVELS, get_settings, normalize_log_level
from service.store.processes import exit_on_signals, hangup_as_terminate


def cmd_migrate(args: argparse.Namespace) -> int:
    from service.store.db import resolve_database_url
    from service.store.migrate import downgrade, upgrade

    url = resolve_database_url()
    if args.downgrade:
        downgrade(url, args.downgrade)
    else:
        upgrade(url, args.revision)
    print(f"migrated {'down to ' + args.downgrade if args.downgrade else 'to ' + args.revision}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.store.db import resolve_database_url
    from service.store.migrate import upgrade

    settings = get_settings()
    host = args.host or settings.host
    port = args.port or settings.port
    check_port_free(host, port)  # before anything is printed, migrated or started
    url = resolve_database_url(settings)
    upgrade(url)
    auth = auth_gate(url, host, insecure=args.insecure_no_auth, require=settings.require_auth)
    if auth is None:
        return 2
    # workers (and any process the service starts) reuse the resolved server instead of starting their own
    os.environ["DATABASE_URL"] = url
    get_settings.cache_clear()
    workers = args.workers or settings.workers
    print(f"grpo-curator serving on http://{host}:{port} (auth {auth}; docs at /docs, dashboard at /dashboard)",
          flush=True)
    from uvicorn.config import STARTUP_FAILURE

    hangup_as_terminate()  # uvicorn handles SIGTERM, not SIGHUP: a hang-up must not raise inside its loop
    raise_open_files_limit()
    try:
        uvicorn.run(
            "service.app:create_served_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=settings.log_level,
            # after SIGTERM, open requests (long polls, exports a client stopped reading) get this long,
            # then are cancelled, so shutdown always completes (uvicorn annotates it int but hands it to
            # asyncio.timeout, which takes float seconds: a fractional setting is honoured)
            timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]
            timeout_keep_alive=settings.keep_alive_s,
        )
    except SystemExit as exc:  # uvicorn exits 3 when it cannot start (its reason is logged at error level)
        if exc.code != STARTUP_FAILURE:
            raise
        raise CommandFailed(f"the server could not start on {host}:{port} (port in use? the reason is logged at "
                            "--log-level error or lower)") from None
    return 0


def raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one (workers inherit it): every idle keep-alive connection
    holds a descriptor for GRPO_CURATOR_KEEP_ALIVE_S, and under the common soft limit of 1,024 about 1,000 idle
    clients made the server drop every new connection, /healthz and long polls included (helper-40)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # the kernel's own cap (nr_open) is lower: keep what we have
            pass


def check_port_free(host: str, port: int) -> None:
    """Bind (and release) ``host:port`` the way uvicorn will; a port in use is one clear error up front,
    not "serving on ..." followed by uvicorn's errno 98 and a second error."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CommandFailed(f"--host {host!r}: cannot resolve it ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise CommandFailed(f"cannot serve on {host}:{port}: {reason} (another server there? stop it, or pick "
                                "another with --port / GRPO_CURATOR_PORT)") from None


def auth_gate(url: str, host: str, *, insecure: bool, require: bool) -> str | None:
    """With no API key, serve stays open on a loopback host (one log line) and refuses any other host
    unless ``--insecure-no-auth``; returns "on" / "off" (start), or None (refuse)."""
    from service.auth.keys import any_key
    from service.auth.service import is_loopback
    from service.store.db import get_engine, make_sessionmaker

    with make_sessionmaker(get_engine(url)).begin() as session:
        has_keys = any_key(session)
    if has_keys or require:
        logging.getLogger("service.auth").info("auth on: every route except /healthz needs an API key")
        return "on"
    if is_loopback(host) or insecure:
        logging.getLogger("service.auth").warning(
            "auth off: no API key exists, every route is open to anyone who can reach %s "
            "(create one with: grpo-curator keys create --role admin --name NAME)", host
        )
        return "off"
    print(
        f"error: refusing to serve on {host} without API keys: anyone who can reach it could write data.\n"
        "  create a key first:  grpo-curator keys create --role admin --name ops\n"
        "  or serve on 127.0.0.1, or pass --insecure-no-auth to run open anyway",
        file=sys.stderr,
    )
    return None


LATER = {
    "score-worker": ("service.worker.main", "score / curate worker: claims received groups, scores and curates them"),
    "train": ("trainer.cli", "GRPO trainer: lease -> train -> ack -> publish"),
    "rollout": ("rollout.producer", "rollout producer: sample groups and post them"),
    "demo": ("rollout.demo", "the whole loop on a tiny model, embedded PostgreSQL"),
    "stats": ("service.cli.stats", "print reward statistics as a table"),
    "import": ("service.cli.import_prompts", "import prompts from verl Parquet or JSONL"),
    "export": ("service.cli.export", "export SFT / DPO / KTO / rollout datasets (Parquet or JSONL)"),
    "archive": ("service.cli.archive", "move finished groups older than --older-than to Parquet (--to DIR|s3://...)"),
    "keys": ("service.cli.keys", "API keys: create --role R --name N [--dataset D], list, revoke NAME"),
    "infer": ("service.cli.infer", "an OpenAI-compatible inference server over transformers (token ids, log-probs)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-curator",
        epilog=f"Global options (before or after the command): --log-level {'|'.join(LOG_LEVELS)} "
        "(warn and fatal are aliases; default warning), --debug (full tracebacks).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = get_settings()
    p = sub.add_parser(
        "serve", help="run the API (and an in-process worker); migrates to head first",
        description="Run the API (and, unless GRPO_CURATOR_EMBEDDED_WORKER=false, an in-process score worker). "
        "Migrates the database to head first. With DATABASE_URL unset, an embedded PostgreSQL is started. "
        "Every option also reads its GRPO_CURATOR_* variable (shown as the default).",
    )
    p.add_argument("--host", metavar="HOST",
                   help=f"interface to listen on; a non-loopback host needs an API key (default: {defaults.host}, "
                        "GRPO_CURATOR_HOST)")
    p.add_argument("--port", type=int, metavar="PORT",
                   help=f"TCP port (default: {defaults.port}, GRPO_CURATOR_PORT)")
    p.add_argument("--workers", type=int, metavar="N",
                   help=f"uvicorn worker processes (default: {defaults.workers}, GRPO_CURATOR_WORKERS)")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="serve a non-loopback host although no API key exists (default: off: refused)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("migrate", help="alembic upgrade head (or --downgrade REV)")
    p.add_argument("--revision", default="head", help="upgrade to this revision (default: head)")
    p.add_argument("--downgrade", metavar="REV", help="downgrade to this revision instead")
    p.set_defaults(func=cmd_migrate)
    for name, (_module, help_text) in LATER.items():  # dispatched in main(); listed here for --help
        sub.add_parser(name, help=help_text + f" (grpo-curator {name} --help)")
    parser.description = f"The grpo-curator command line: {', '.join(sub.choices)}."  # from the parser itself
    return parser


def _global_options(argv: list[str]) -> tuple[list[str], bool, str]:
    """Pull ``--debug`` and ``--log-level LEVEL`` out of argv (before or after the command)."""
    rest, debug, level, i = [], False, os.environ.get("GRPO_CURATOR_LOG_LEVEL", "warning"), 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--debug":
            debug = True
        elif arg == "--log-level" and i + 1 < len(argv):
            level, i = argv[i + 1], i + 1
        elif arg.startswith("--log-level="):
            level = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return rest, debug, level


def _configure_logging(level: str, debug: bool) -> None:
    try:  # the one list of levels (service.settings), known to logging and to uvicorn alike
        name = "debug" if debug else normalize_log_level(level)
    except ValueError:
        raise CommandFailed(f"--log-level {level!r}: expected one of {', '.join(LOG_LEVELS)} "
                            f"(aliases: {', '.join(LOG_LEVEL_ALIASES)})") from None
    logging.basicConfig(level=name.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for noisy in ("httpx", "httpcore"):  # one line per request otherwise, between the command's own lines
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    os.environ["GRPO_CURATOR_LOG_LEVEL"] = name  # serve's uvicorn, children


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in LATER:  # these parse their own options (argparse's REMAINDER drops leading --flags)
        import importlib

        hint = missing_extra(argv[0])
        if hint:
            raise CommandFailed(hint)
        check_set_options(argv[0], argv[1:])
        return int(importlib.import_module(LATER[argv[0]][0]).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Every failure ends in one line on stderr and a non-zero exit; ``--debug`` shows the traceback."""
    argv, debug, level = _global_options(sys.argv[1:] if argv is None else list(argv))
    exit_on_signals()  # SIGTERM runs the exit hooks (the embedded PostgreSQL stops with its last user)
    command = argv[0] if argv else ""
    try:
        _configure_logging(level, debug)
        return _dispatch(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 -- the one place a command's failure becomes a message
        if debug:
            raise
        print(f"error: {explain(exc, command)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""What the command line says when a command fails: one line naming the problem and the fix.

``explain(exc, command)`` turns an exception into that line; ``grpo-curator --debug`` shows the
traceback instead. ``missing_extra(command)`` names the optional dependencies a command needs and lacks.
"""

from __future__ import annotations

import importlib.util
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

# commands that need the ``trainer`` extra (torch, transformers), and the modules that extra provides
TRAINER_COMMANDS = ("train", "rollout", "demo")
TRAINER_MODULES = ("torch", "transformers", "safetensors")
EXTRA_HINT = "pip install 'grpo-curator[trainer]' (or, in a checkout, `make install-dev` / `make demo`)"


class CommandFailed(Exception):
    """A failure the command itself explains (bad arguments, bad configuration): printed as is."""


class ServiceAnswered(RuntimeError):
    """The service answered an error: the line names the method, the service URL (path included, query
    left out), the status and what the service said. Printed through ``connection.redact`` like every line
    of the client commands (a URL's userinfo becomes ``***@``, the key ``***``)."""

    def __init__(self, method: str | None, url: str, status: int, said: str) -> None:
        where = f"{method} {url}" if method else url
        super().__init__(f"{where}: {status} {' '.join(said.split())[:500]}")
        self.status = status

    @classmethod
    def of(cls, r: httpx.Response) -> ServiceAnswered:
        """From an answer whose body was read."""
        return cls(r.request.method, str(r.request.url.copy_with(query=None)), r.status_code, r.text)


def missing_extra(command: str) -> str | None:
    """The line to print when ``command`` needs the trainer extra and it is not installed; else None."""
    if command not in TRAINER_COMMANDS:
        return None
    missing = [m for m in TRAINER_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return f"`grpo-curator {command}` needs the trainer extra ({', '.join(missing)} not installed): {EXTRA_HINT}"


def check_set_options(command: str, argv: list[str]) -> None:
    """``--set KEY=VALUE`` options of ``train`` / ``rollout``: each must have a non-empty KEY and a ``=``."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--set" and i + 1 < len(argv) else arg[6:] if arg.startswith("--set=") else None
        if value is None:
            continue
        key, sep, _ = value.partition("=")
        if not sep or not key.strip() or any(not part for part in key.split(".")):
            raise CommandFailed(f"{command} --set {value!r}: expected KEY=VALUE, e.g. --set loss.beta=0.04")


def _database_line(message: str) -> str | None:
    missing = re.search(r'database "([^"]+)" does not exist', message)
    where = re.search(r'server at "([^"]+)"(?:[^,]*), port (\d+)', message)
    host, port = (where.group(1), where.group(2)) if where else ("HOST", "PORT")
    if missing:
        name = missing.group(1)
        return (
            f'the database "{name}" does not exist on {host}:{port}; create it with '
            f'`createdb -h {host} -p {port} -U postgres {name}` (or psql -c \'CREATE DATABASE "{name}"\'), '
            "or unset DATABASE_URL to use the embedded PostgreSQL"
        )
    if "password authentication failed" in message or "no pg_hba.conf entry" in message:
        return f"PostgreSQL at {host}:{port} refused the login; check the user and password in DATABASE_URL"
    if "Connection refused" in message or "is the server running" in message.lower() or "could not translate" in message:
        return (
            f"cannot reach PostgreSQL at {host}:{port}; start it, fix DATABASE_URL, "
            "or unset DATABASE_URL to use the embedded PostgreSQL"
        )
    return None


def explain(exc: BaseException, command: str) -> str:
    """The one line printed (after ``error: ``) for an exception that ended ``command``."""
    if isinstance(exc, CommandFailed):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] in TRAINER_MODULES:
        return f"`grpo-curator {command}` needs the trainer extra ({exc.name} not installed): {EXTRA_HINT}"
    text = " ".join(str(exc).split())
    kind = type(exc).__name__
    if kind == "OperationalError":  # sqlalchemy / psycopg, not imported here (the CLI stays light)
        return _database_line(text) or f"database: {text.split('(Background on this error')[0].strip()}"
    if kind == "CommandError" and type(exc).__module__.startswith("alembic"):
        if "didn't produce" in text or "Relative revision" in text:
            return f"migrate --downgrade: no revision that far down ({text}); the database is at or near base"
        return f"migrate: {text}"
    if isinstance(exc, ValueError | FileNotFoundError | PermissionError):
        return text
    return f"{kind}: {text} (run with --debug for the traceback)"

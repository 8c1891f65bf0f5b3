"""The one client configuration of every command that talks to a running service (``import``, ``export``,
``stats``): ``--url`` (else ``GRPO_CURATOR_URL``, else ``http://127.0.0.1:<GRPO_CURATOR_PORT or 8000>``)
and ``--api-key`` (else ``GRPO_CURATOR_API_KEY``). ``keys`` works on the database itself (DATABASE_URL),
not through the service, so it takes neither.

The resolution itself is ``service.client.resolve_connection`` (the one place: ``train``, ``rollout`` and the
trainer adapters use it too). A failure to reach the service names the URL it tried, never a bare
``[Errno -2]``; every error line goes through ``redact``: a URL's ``user:password@`` and the API key never
reach the terminal.
"""

from __future__ import annotations

import argparse
import os

import httpx

from service.client import API_KEY_ENV, URL_ENV, Connection, default_url, resolve_connection, tls_context
from service.client import redact as _redact


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"the service (default: {URL_ENV}, else http://127.0.0.1:GRPO_CURATOR_PORT "
                                      f"or 8000; now {redact(default_url())})")
    parser.add_argument("--api-key", help=f"sent as Authorization: Bearer (default: {API_KEY_ENV}); surrounding "
                                          f"whitespace is stripped; --api-key '' sends no key")


def connection(args: argparse.Namespace) -> Connection:
    """``--url`` / ``--api-key`` over the environment (``service.client.resolve_connection``)."""
    return resolve_connection(getattr(args, "url", None), getattr(args, "api_key", None), url_source="--url",
                              key_source="--api-key")


def service_url(args: argparse.Namespace) -> str:
    """``--url``, else ``GRPO_CURATOR_URL``, else the local default; a URL that is not http(s) is a ValueError."""
    return connection(args).url


def api_key(args: argparse.Namespace) -> str | None:
    return connection(args).api_key


def api_key_of(argv: list[str] | None) -> str | None:
    """``--api-key`` in a command line (``train``, ``rollout``), else ``GRPO_CURATOR_API_KEY``."""
    ap = argparse.ArgumentParser(add_help=False)
    add_client_options(ap)
    return connection(ap.parse_known_args(argv)[0]).api_key


def redact(text: str, args: argparse.Namespace | None = None) -> str:
    """An error line without any URL's userinfo, the URL's password or the API key (``--api-key`` / env)."""
    key = (getattr(args, "api_key", None) if args is not None else None) or os.environ.get(API_KEY_ENV)
    url = (getattr(args, "url", None) if args is not None else None) or default_url()
    try:
        password = httpx.URL(url).password or None
    except (httpx.InvalidURL, TypeError):
        password = None
    return _redact(text, key, password)


def http_client(url: str, key: str | None, timeout: float = 300.0) -> httpx.Client:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout, verify=tls_context())


def unreachable(url: str, exc: BaseException) -> str:
    """The line for a service that could not be reached: the URL, why, and what to do."""
    if isinstance(exc, httpx.LocalProtocolError):  # raised before anything was sent: our own request is bad
        return redact(f"the request to {url} could not be sent ({type(exc).__name__}): the API key is malformed "
                      f"(fix --api-key / {API_KEY_ENV}; the key is not shown)")
    why = str(exc) or type(exc).__name__
    if "Name or service not known" in why or "[Errno -2]" in why or "[Errno -3]" in why:
        why = f"unknown host {httpx.URL(url).host!r}"
    elif "Connection refused" in why or "[Errno 111]" in why:
        why = "connection refused"
    return redact(f"cannot reach the service at {url} ({why}); start it (`grpo-curator serve`) or fix --url / "
                  f"{URL_ENV}")

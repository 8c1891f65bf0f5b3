"""Typed HTTP client (httpx) for every endpoint: used by producers, trainers, tests and the demo.

Trainers lease batches with ``lease`` / ``ack`` / ``nack``, or let ``batches`` drive the loop::

    with client.batches("trainer-0", max_trajectories=512, wait_seconds=10) as stream:
        for batch in stream:          # leases (retrying transient errors with the same request_id)
            train_step(batch)         # the block succeeded -> acked when the next batch is asked for
                                      # an exception -> nacked, so the groups are delivered again
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlsplit

import httpx
import orjson

from service.api.wire_checks import ARROW_MEDIA_TYPE

log = logging.getLogger(__name__)

API_KEY_ENV = "GRPO_CURATOR_API_KEY"
BatchFormat = Literal["json", "arrow"]
BATCH_FORMATS: tuple[str, ...] = ("json", "arrow")
T = TypeVar("T")


class CuratorError(Exception):
    """A 4xx / 5xx answer from the service; ``message`` is the service's ``error`` field."""

    def __init__(self, status_code: int, message: str, detail: Any = None) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.detail = detail


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the connection failed / timed out, or the service answered 5xx or 429."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, CuratorError) and (exc.status_code >= 500 or exc.status_code == 429)


def decode_arrow(data: bytes, *, as_numpy: bool = False) -> dict[str, Any]:
    """An Arrow IPC lease answer -> the JSON answer's shape (``as_numpy``: numpy views instead of lists)."""
    from service.delivery.arrow import decode_arrow as _decode  # pyarrow only for trainers that use Arrow

    return _decode(data, as_numpy=as_numpy)


@dataclass(frozen=True)
class AgentSessionKey:
    """An open agent session: ``base_url`` and ``api_key`` are what an OpenAI client needs (the key is
    valid for this one session only)."""

    session_id: str
    base_url: str
    api_key: str
    group_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client for this session (needs the ``openai`` package)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


def tls_context() -> ssl.SSLContext:
    """httpx's default certificate check (its CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR as they are now), built
    once a process for each value of those two: a client built with the default builds its own, ~40 ms of CPU
    parsing the CA bundle again (most of a CLI command's client, and most of the CPU of a loop that makes a
    client a request). A context is shared safely."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context()  # reads the same two variables (trust_env)


def health_client(timeout_s: float) -> httpx.Client:
    """One client for a loop of health polls: no connection kept between polls (a server that restarts or
    closes idle connections is asked afresh each time), the shared TLS context."""
    return httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_keepalive_connections=0), verify=tls_context())


class CuratorClient:
    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        *,
        api_key: str | None = None,
        unavailable_retries: int = 6,
        max_retry_after_s: float = 10.0,
    ) -> None:
        """``api_key``: sent as ``Authorization: Bearer``; defaults to ``$GRPO_CURATOR_API_KEY``.
        ``unavailable_retries``: how often a 503 with ``Retry-After`` (the service's "database
        unavailable") is retried, waiting what it says (at most ``max_retry_after_s``) before each;
        every route is safe to repeat."""
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.unavailable_retries = unavailable_retries
        self.max_retry_after_s = max_retry_after_s
        key = clean_api_key(api_key, "api_key") if api_key is not None else clean_api_key(
            os.environ.get(API_KEY_ENV), API_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers,
                                  verify=tls_context())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CuratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call; a 503 with ``Retry-After`` is retried ``unavailable_retries`` times, waiting what it
        says. A 503 that names an alert (the lease breaker: leasing is paused) is logged with its alert on
        the first answer -- the reason is never held back until the retries run out -- and again only when
        another alert pauses it; the waiting goes on the same way. What is left after the retries raises
        ``CuratorError`` with the body's ``detail`` (the alert included)."""
        response = self._http.request(method, path, **kwargs)
        told: str | None = None  # the alert already logged in this call
        for attempt in range(self.unavailable_retries):
            if response.status_code != 503 or "retry-after" not in response.headers:
                break
            delay = _retry_after(response, self.max_retry_after_s)
            error, detail = _error_body(response)
            alert = _pause_alert(detail)
            if alert is None:
                log.warning("%s %s: 503 (unavailable); retry %d/%d in %.1f s", method, path, attempt + 1,
                            self.unavailable_retries, delay)
            elif alert.get("id") != told:
                told = alert.get("id")
                log.warning("%s %s: leasing paused by the service (alert %s, monitor %s, dataset %s): %s;"
                            " waiting %.1f s between attempts", method, path, alert.get("id"), alert.get("monitor"),
                            alert.get("dataset"), error, delay)
            time.sleep(delay)
            response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            error, detail = _error_body(response)
            raise CuratorError(response.status_code, error, detail)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return orjson.loads(self._request(method, path, **kwargs).content)

    # -- ingest -----------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz")

    def upsert_prompts(self, prompts: list[dict[str, Any]]) -> dict[str, Any]:
        return self._json("POST", "/v1/prompts", json={"prompts": prompts})

    def post_group(self, group: dict[str, Any], *, format: BatchFormat = "json") -> dict[str, Any]:
        """``format="arrow"``: the token arrays travel as Arrow columns (``service.ingest.arrow_body``)."""
        return self._post_groups(group, format)

    def post_groups(self, groups: list[dict[str, Any]], *, format: BatchFormat = "json") -> dict[str, Any]:
        return self._post_groups({"groups": groups}, format)

    def _post_groups(self, body: dict[str, Any], format: BatchFormat) -> dict[str, Any]:
        if format not in BATCH_FORMATS:
            raise ValueError(f"format: unknown {format!r}; valid: {', '.join(BATCH_FORMATS)}")
        if format == "json":
            return self._json("POST", "/v1/groups", json=body)
        from service.ingest.arrow_body import encode_groups  # pyarrow only for producers that use Arrow

        return self._json("POST", "/v1/groups", content=encode_groups(body), headers={"Content-Type": ARROW_MEDIA_TYPE})

    def get_group(self, group_id: str, *, include_tokens: bool = False) -> dict[str, Any]:
        return self._json("GET", f"/v1/groups/{segment(group_id)}", params={"include_tokens": include_tokens})

    def fill_slot(self, group_id: str, index: int, policy_version: int, trajectory: dict[str, Any],
                  request_id: int | None = None) -> dict[str, Any]:
        """POST /v1/groups/{group_id}/trajectories/{index}: the replacement a resample / resume request asked for
        (``request_id``: that request's, so a fill sent to the wrong slot is a 409)."""
        body: dict[str, Any] = {"policy_version": policy_version, "trajectory": trajectory}
        if request_id is not None:
            body["request_id"] = request_id
        return self._json("POST", f"/v1/groups/{segment(group_id)}/trajectories/{index}", json=body)

    def list_groups(self, **filters: Any) -> dict[str, Any]:
        params = {k: v for k, v in filters.items() if v is not None}
        return self._json("GET", "/v1/groups", params=params)

    # -- agent sessions (docs/agents.md) ----------------------------------------------------------------
    def session(self, group_id: str, group_size: int, policy_version: int, *, prompt_id: str,
                prompt: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> AgentSessionKey:
        """POST /v1/sessions: one agent episode of group ``group_id``. Point an OpenAI client at it:
        ``openai.OpenAI(base_url=s.base_url, api_key=s.api_key)`` (or ``s.openai()``)."""
        body: dict[str, Any] = {"group_id": group_id, "group_size": group_size, "policy_version": policy_version,
                                "prompt_id": prompt_id, "metadata": metadata or {}}
        if prompt is not None:
            body["prompt"] = prompt
        out = self._json("POST", "/v1/sessions", json=body)
        return AgentSessionKey(session_id=out["session_id"], base_url=out["base_url"], api_key=out["api_key"],
                               group_id=group_id)

    def finish_session(self, session: AgentSessionKey, *, finish_reason: str | None = None,
                       final_answer: str | None = None, rewards: dict[str, float] | None = None,
                       error: str | None = None) -> dict[str, Any]:
        """POST /v1/sessions/{id}/finish with the session's own key. ``error``: the environment failed
        (a tool's backend down): the episode is dropped, never a negative."""
        body: dict[str, Any] = {"rewards": rewards or {}}
        for name, value in (("finish_reason", finish_reason), ("final_answer", final_answer), ("error", error)):
            if value is not None:
                body[name] = value
        return self._json("POST", f"/v1/sessions/{segment(session.session_id)}/finish", json=body,
                          headers=session.headers)

    def get_session(self, session: AgentSessionKey, *, include_tokens: bool = False) -> dict[str, Any]:
        """GET /v1/sessions/{id}: the session and its calls (``include_tokens``: their ids and log-probs)."""
        return self._json("GET", f"/v1/sessions/{segment(session.session_id)}",
                          params={"include_tokens": include_tokens}, headers=session.headers)

    # -- batches ----------------------------------------------------------------------------------------
    def lease(
        self,
        trainer_id: str,
        *,
        max_groups: int | None = None,
        max_trajectories: int | None = None,
        max_tokens: int | None = None,
        max_staleness: int | None = None,
        lease_seconds: float = 300,
        wait_seconds: float = 0,
        request_id: str | None = None,
        format: BatchFormat = "json",
        order: Literal["oldest", "freshest"] | None = None,
        as_numpy: bool = False,
        min_groups: int | None = None,
        need_logprobs: bool = False,
    ) -> dict[str, Any] | None:
        """Lease a batch: ``{"batch_id", "expires_at", "groups": [...], "stats"}``, or None (204) when
        nothing was ready within ``wait_seconds``. Give exactly one of the three ``max_*`` sizes.

        ``format="arrow"`` moves the batch as Arrow IPC and decodes it to the same shape
        (``as_numpy=True``: numpy views instead of lists).
        """
        if format not in BATCH_FORMATS:
            raise ValueError(f"format: unknown {format!r}; valid: {', '.join(BATCH_FORMATS)}")
        body = {
            "trainer_id": trainer_id,
            "max_groups": max_groups,
            "max_trajectories": max_trajectories,
            "max_tokens": max_tokens,
            "max_staleness": max_staleness,
            "lease_seconds": lease_seconds,
            "wait_seconds": wait_seconds,
            "request_id": request_id,
            "order": order,
            "min_groups": min_groups,
            "need_logprobs": need_logprobs or None,
        }
        accept = ARROW_MEDIA_TYPE if format == "arrow" else "application/json"
        response = self._request(
            "POST",
            "/v1/batches/lease",
            content=orjson.dumps({k: v for k, v in body.items() if v is not None}),
            headers={"Accept": accept, "Content-Type": "application/json"},
            timeout=self.timeout + wait_seconds,
        )
        if response.status_code == 204:
            return None
        if format == "arrow":
            return decode_arrow(response.content, as_numpy=as_numpy)
        return orjson.loads(response.content)

    def ack(self, batch_id: str) -> dict[str, Any]:
        """Consume the batch's groups; 409 (CuratorError) when the lease expired and was taken over."""
        return self._json("POST", f"/v1/batches/{segment(batch_id)}/ack")

    def nack(self, batch_id: str, *, reason: str | None = None, drop: bool = False,
             vocab_size: int | None = None) -> dict[str, Any]:
        """Give the batch's groups back to the queue (``drop``: they cannot be trained on; drop them;
        ``vocab_size``: the trainer's vocabulary, so the service can verify an out-of-vocabulary refusal)."""
        body = _params(reason=reason, drop=drop or None, vocab_size=vocab_size)
        return self._json("POST", f"/v1/batches/{segment(batch_id)}/nack", json=body or None)

    def extend(self, batch_id: str, lease_seconds: float) -> dict[str, Any]:
        """Heartbeat: the lease now expires ``lease_seconds`` from now; 409 once it ended."""
        return self._json("POST", f"/v1/batches/{segment(batch_id)}/extend", json={"lease_seconds": lease_seconds})

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/batches/{segment(batch_id)}")

    def batches(
        self,
        trainer_id: str,
        *,
        max_batches: int | None = None,
        stop_when_empty: bool = False,
        retries: int = 8,
        backoff_s: float = 0.2,
        idle_s: float = 1.0,
        **lease_kwargs: Any,
    ) -> BatchStream:
        """Leased batches as an iterator (and context manager): see ``BatchStream``."""
        return BatchStream(
            self,
            trainer_id,
            max_batches=max_batches,
            stop_when_empty=stop_when_empty,
            retries=retries,
            backoff_s=backoff_s,
            idle_s=idle_s,
            lease_kwargs=lease_kwargs,
        )

    # -- policy -----------------------------------------------------------------------------------------
    def publish_policy(self, version: int, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Publish ``version``; a metric JSON cannot carry (inf, NaN) is left out with a warning."""
        return self._json("POST", "/v1/policy", json={"version": version, "metrics": finite_metrics(metrics)})

    def get_policy(self) -> dict[str, Any]:
        return self._json("GET", "/v1/policy")

    def policy_history(self, limit: int = 100) -> dict[str, Any]:
        return self._json("GET", "/v1/policy/history", params={"limit": limit})

    # -- specs, policies, datasets ---------------------------------------------------------------------
    def create_reward_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/reward-specs", json=spec)

    def get_reward_spec(self, name: str, version: int | None = None) -> dict[str, Any]:
        return self._json("GET", f"/v1/reward-specs/{segment(name)}", params=_params(version=version))

    def create_curation_policy(self, policy: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/curation-policies", json=policy)

    def get_curation_policy(self, name: str, version: int | None = None) -> dict[str, Any]:
        return self._json("GET", f"/v1/curation-policies/{segment(name)}", params=_params(version=version))

    def set_dataset(self, name: str, *, reward_spec: str | None = None, curation_policy: str | None = None) -> dict[str, Any]:
        body = {"reward_spec": reward_spec, "curation_policy": curation_policy}
        return self._json("PUT", f"/v1/datasets/{segment(name)}", json=body)

    def rescore(self, reward_spec: str, **filters: Any) -> dict[str, Any]:
        return self._json("POST", "/v1/rescore", json={"reward_spec": reward_spec, **_params(**filters)})

    def recurate(self, curation_policy: str, **filters: Any) -> dict[str, Any]:
        return self._json("POST", "/v1/recurate", json={"curation_policy": curation_policy, **_params(**filters)})

    # -- producers: what to sample next ------------------------------------------------------------------
    def sampling_requests(self, n: int = 10, *, producer_id: str | None = None, dataset: str | None = None,
                          group_size: int | None = None, lease_seconds: float | None = None,
                          include_reference: bool = False) -> list[dict[str, Any]]:
        """Requests to sample; with ``producer_id`` they are claimed for this producer."""
        params = _params(n=n, producer_id=producer_id, dataset=dataset, group_size=group_size,
                         lease_seconds=lease_seconds, include_reference=include_reference or None)
        return self._json("GET", "/v1/sampling/requests", params=params)["requests"]

    def sampling_done(self, request_ids: list[int]) -> dict[str, Any]:
        ids = [i for i in request_ids if i is not None]
        return self._json("POST", "/v1/sampling/requests/done", json={"request_ids": ids}) if ids else {"done": []}

    # -- statistics -------------------------------------------------------------------------------------
    def stats(self, by: str | None = None, **filters: Any) -> dict[str, Any]:
        """GET /v1/stats; ``by`` left out takes the service's default (``dataset``)."""
        return self._json("GET", "/v1/stats", params=_params(by=by, **filters))

    def summary(self, dataset: str | None = None) -> dict[str, Any]:
        """The service's counts; ``dataset``: that dataset's only (what a dataset-scoped key may read)."""
        return self._json("GET", "/v1/summary", params={"dataset": dataset} if dataset is not None else None)


def default_url() -> str:
    """The service the command-line tools talk to: ``GRPO_CURATOR_URL``, else
    ``http://127.0.0.1:<GRPO_CURATOR_PORT or 8000>`` (the port ``serve`` listens on)."""
    url = os.environ.get("GRPO_CURATOR_URL")
    if url:
        return url.rstrip("/")
    return f"http://127.0.0.1:{os.environ.get('GRPO_CURATOR_PORT') or 8000}"


URL_ENV = "GRPO_CURATOR_URL"
# a URL's userinfo runs from the ``//`` to the LAST ``@`` of its authority (as httpx reads it: ``u:p@ss@host``),
# spaces included; only a ``/ ? #`` or a line end stops it (over-redacting an unrelated ``@`` is the safe side)
_USERINFO = re.compile(r"(?<=//)[^/?#\r\n]*@")
REDACTED = "***"


def _forms(secret: str) -> set[str]:
    """The ways ``secret`` can appear in an error: as is, stripped, and escaped (``repr`` of the str and of its
    bytes, as httpx's ``Illegal header value b'Bearer gck_...\\n'`` prints it)."""
    forms = {secret, secret.strip(), repr(secret)[1:-1], str(secret.encode("utf-8", "backslashreplace"))[2:-1]}
    return {f for f in forms if f}


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every URL's userinfo (``user:password@``) replaced by ``***@`` and each of ``secrets``
    (an API key, a password; raw, stripped or escaped) by ``***``: what an error message may say of a connection."""
    text = _USERINFO.sub(f"{REDACTED}@", text)
    forms = {f for s in secrets if s for f in _forms(s)}
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    return text


def clean_api_key(key: str | None, source: str) -> str | None:
    """An API key as sent: surrounding whitespace stripped (a Kubernetes secret's trailing newline); empty ->
    None (no key). A key with any other character than printable ASCII is a ValueError naming ``source``
    (the setting it came from), never the key: it could not be sent as a header."""
    if key is None:
        return None
    key = key.strip()
    if not key:
        return None
    if any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ValueError(f"{source}: the API key holds a space, a control character or a non-ASCII character "
                         f"inside it; it cannot be sent as an Authorization header (the key is not shown)")
    return key


@dataclass(frozen=True)
class Connection:
    """The one client configuration of every command and adapter (``import``, ``export``, ``stats``, ``train``,
    ``rollout``, the verl / OpenRLHF / TRL adapters): ``url`` is the first of the argument (``--url``), a
    command's own config, ``GRPO_CURATOR_URL`` and ``http://127.0.0.1:<GRPO_CURATOR_PORT or 8000>``;
    ``api_key`` the argument (``--api-key``), else ``GRPO_CURATOR_API_KEY``, else none."""

    url: str
    api_key: str | None

    def __repr__(self) -> str:  # never a key, never a URL's password
        return f"Connection(url={redact(self.url)!r}, api_key={'***' if self.api_key else None})"

    def redact(self, text: str) -> str:
        """``text`` (an error message) without this connection's key, its URL's password or any userinfo."""
        return redact(text, self.api_key, httpx.URL(self.url).password if "@" in self.url else None)


def resolve_connection(url: str | None = None, api_key: str | None = None, *, url_source: str = "url",
                       key_source: str = "api_key") -> Connection:
    """``Connection`` from the arguments and the environment. A URL that is not http(s), or that carries a
    ``user:password@`` (httpx would send it as Basic auth in place of the API key), is a ValueError naming
    where it came from (``url_source`` for the argument, else ``GRPO_CURATOR_URL``). The key: ``api_key``
    when given -- an empty one (``--api-key ""``) means explicitly no key, the environment is not read --
    else ``GRPO_CURATOR_API_KEY``; whitespace around it is stripped (``clean_api_key``)."""
    resolved = (url or default_url()).rstrip("/")
    source = url_source if url else URL_ENV
    if not resolved.startswith(("http://", "https://")):
        raise ValueError(f"{source} {redact(resolved)!r}: expected an http:// or https:// URL")
    if "@" in urlsplit(resolved).netloc:
        raise ValueError(f"{source} {redact(resolved)!r}: a user:password@ in the service URL is not used (it "
                         f"would replace the API key as Basic auth); drop it and pass the key with --api-key / "
                         f"{API_KEY_ENV}")
    if api_key is not None:
        return Connection(resolved, clean_api_key(api_key, key_source))
    return Connection(resolved, clean_api_key(os.environ.get(API_KEY_ENV), API_KEY_ENV))


def wait_healthy(url: str, proc: Any = None, timeout_s: float = 60.0) -> None:
    """Poll ``GET /healthz`` until it answers 200. ``proc`` (a Popen) exiting first, or the time running
    out, raises RuntimeError (the server's log is the place to look)."""
    deadline = time.monotonic() + timeout_s
    # one client for the whole wait, no connection kept: a new client per 0.2 s poll was most of a wait's CPU
    with health_client(1) as http:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode} before it was healthy")
            try:
                if http.get(url.rstrip("/") + "/healthz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"{url} was not healthy within {timeout_s:.0f} s")


def segment(value: str) -> str:
    """One path segment, percent-encoded whole: '/', '#', '?', '%' and spaces stay inside the id."""
    if value in (".", ".."):  # dot segments would be resolved away by the URL
        return value.replace(".", "%2E")
    return quote(value, safe="")


def _retry_after(response: httpx.Response, cap_s: float) -> float:
    """The answer's ``Retry-After`` in seconds (1 when absent, not a number or not finite: ``nan``, ``inf``),
    at most ``cap_s``."""
    try:
        seconds = float(response.headers.get("retry-after", "1"))
    except ValueError:
        seconds = 1.0
    if not math.isfinite(seconds):
        seconds = 1.0
    return min(max(seconds, 0.0), cap_s)


def _error_body(response: httpx.Response) -> tuple[str, Any]:
    """An error answer's ``error`` message and ``detail`` (the raw text and None when it is not our JSON)."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return response.text, None
    return str(body.get("error", response.text)), body.get("detail")


def _pause_alert(detail: Any) -> dict[str, Any] | None:
    """The alert a 503's detail names when leasing is paused (service.alerts' breaker), else None."""
    alert = detail.get("alert") if isinstance(detail, dict) else None
    return alert if isinstance(alert, dict) else None


def finite_metrics(metrics: dict[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """``metrics`` without the numbers JSON cannot carry: each non-finite float (inf, NaN, also in a nested
    dict) is dropped with a warning naming it, so publishing never fails on a metric."""
    out: dict[str, Any] = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, dict):
            out[key] = finite_metrics(value, f"{prefix}{key}.")
        elif isinstance(value, float) and not math.isfinite(value):
            log.warning("metric %s%s is %r (not finite): left out of the published metrics", prefix, key, value)
        else:
            out[key] = value
    return out


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def retry(fn: Callable[[], T], *, retries: int, backoff_s: float, what: str) -> T:
    """Call ``fn``, retrying transient errors ``retries`` times with exponential backoff (capped at 5 s)."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except (httpx.TransportError, CuratorError) as exc:
            if not is_transient(exc) or attempt == retries:
                raise
            delay = min(backoff_s * 2**attempt, 5.0)
            log.warning("%s failed (%s); retry %d/%d in %.1f s", what, exc, attempt + 1, retries, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


class BatchStream:
    """Lease -> yield -> ack, until ``max_batches`` batches or (``stop_when_empty``) an empty lease.

    - A lease is retried on transient errors with the SAME request_id, so a batch the service made
      but whose answer was lost comes back instead of a second one.
    - The previous batch is acked when the caller asks for the next (its block succeeded) or when the
      stream ends. Ack and nack are idempotent, so they are retried too.
    - Under ``with``: leaving the block with an exception nacks the outstanding batch, leaving it
      normally (``break`` included) acks it. Without ``with``, a loop left early (``break`` or an
      exception; the two cannot be told apart) nacks it: the groups are delivered again, never lost.
    - An ack refused with 409 (the lease expired and was re-leased) is logged and its batch id kept
      in ``refused``: another lease consumes those groups.
    """

    def __init__(
        self,
        client: CuratorClient,
        trainer_id: str,
        *,
        max_batches: int | None,
        stop_when_empty: bool,
        retries: int,
        backoff_s: float,
        idle_s: float,
        lease_kwargs: dict[str, Any],
    ) -> None:
        if "request_id" in lease_kwargs:
            raise ValueError("request_id: chosen by the stream for each batch; do not pass one")
        self.client, self.trainer_id = client, trainer_id
        self.max_batches, self.stop_when_empty = max_batches, stop_when_empty
        self.retries, self.backoff_s, self.idle_s = retries, backoff_s, idle_s
        self.lease_kwargs = lease_kwargs
        self.acked: list[str] = []
        self.nacked: list[str] = []
        self.refused: list[str] = []
        self._outstanding: str | None = None
        self._managed = False

    def __enter__(self) -> BatchStream:
        self._managed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._settle(ok=exc_type is None)
        self._managed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._run()

    def _run(self) -> Iterator[dict[str, Any]]:
        n = 0
        try:
            while self.max_batches is None or n < self.max_batches:
                batch = self._lease()
                if batch is None:
                    if self.stop_when_empty:
                        return
                    if not self.lease_kwargs.get("wait_seconds"):
                        time.sleep(self.idle_s)  # no long poll asked for: do not spin
                    continue
                self._outstanding = batch["batch_id"]
                yield batch
                self._settle(ok=True)
                n += 1
        finally:
            if not self._managed:
                self._settle(ok=False)

    def _lease(self) -> dict[str, Any] | None:
        request_id = uuid.uuid4().hex

        def attempt() -> dict[str, Any] | None:
            nonlocal request_id
            try:
                return self.client.lease(self.trainer_id, request_id=request_id, **self.lease_kwargs)
            except CuratorError as exc:
                if exc.status_code != 409:
                    raise
                # a retried request_id whose lease already ended (it expired while we were away): start afresh
                request_id = uuid.uuid4().hex
                return self.client.lease(self.trainer_id, request_id=request_id, **self.lease_kwargs)

        return retry(attempt, retries=self.retries, backoff_s=self.backoff_s, what="lease")

    def _settle(self, *, ok: bool) -> None:
        """Ack (ok) or nack the outstanding batch, if any."""
        batch_id, self._outstanding = self._outstanding, None
        if batch_id is None:
            return
        call = self.client.ack if ok else self.client.nack
        try:
            retry(
                lambda: call(batch_id),
                retries=self.retries,
                backoff_s=self.backoff_s,
                what="ack" if ok else "nack",
            )
        except CuratorError as exc:
            if exc.status_code != 409:
                raise
            log.warning("%s of batch %s refused: %s", "ack" if ok else "nack", batch_id, exc.message)
            if ok:
                self.refused.append(batch_id)
            return
        (self.acked if ok else self.nacked).append(batch_id)

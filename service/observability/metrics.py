"""Prometheus metrics measured in this process (``GET /metrics`` adds the database gauges of
``service.observability.summary``; a score worker serves these on its own port, ``--metrics-port``).

Names (all prefixed ``grpo_curator_``):
- ``http_request_duration_seconds{method, route, status}`` histogram: every API request, by route
  template (``/v1/groups/{group_id}``, never the raw path, so ids do not explode the label set) and
  method (GET HEAD POST PUT PATCH DELETE OPTIONS, any other token ``other``).
- ``lease_wait_seconds{result}`` histogram: how long ``POST /v1/batches/lease`` took, ``result`` =
  ``batch`` (200) or ``empty`` (204 after ``wait_seconds``) or ``error``.
- ``component_latency_seconds{kind, component, path}`` histogram and ``component_results_total{kind,
  component, result, path}`` counter (``result`` = ``ok`` | ``error``): every reward component run, on
  every scoring path: ``path`` = ``worker`` (the score worker, embedded or not; rescoring included),
  ``score`` (``POST /v1/score``) or ``openrlhf`` (the OpenRLHF reward route).
- ``monitor_state{monitor, dataset}`` gauge: each training-health monitor, 0 ok / 1 warning / 2 critical
  (service.alerts; docs/alerts.md).
With several uvicorn workers each process has its own histograms; scrape each, or run one worker per
replica (the database gauges are the same from every replica).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REGISTRY = CollectorRegistry()
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)

HTTP_DURATION = Histogram(
    "grpo_curator_http_request_duration_seconds",
    "API request duration by method, route template and status",
    ["method", "route", "status"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
LEASE_WAIT = Histogram(
    "grpo_curator_lease_wait_seconds",
    "time a trainer waited in POST /v1/batches/lease, by result (batch | empty | error)",
    ["result"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
SCORING_PATHS = ("worker", "score", "openrlhf")
COMPONENT_LATENCY = Histogram(
    "grpo_curator_component_latency_seconds",
    "reward component scoring latency per sample, by scoring path (worker | score | openrlhf)",
    ["kind", "component", "path"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
COMPONENT_RESULTS = Counter(
    "grpo_curator_component_results",
    "reward component runs by result (ok | error) and scoring path (worker | score | openrlhf)",
    ["kind", "component", "result", "path"],
    registry=REGISTRY,
)
LEASE_ROUTE = "/v1/batches/lease"
UNMATCHED = "unmatched"  # requests no route matched (404s): one label value, not one per path
# HTTP accepts any token as a method: anything else is labelled "other", so clients cannot grow the series
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"


_CONVERTOR = re.compile(r"\{(\w+):\w+\}")


def route_label(scope: Scope) -> str:
    """The ``route`` label: the matched route's template without path convertors
    (``/v1/groups/{group_id:path}`` -> ``/v1/groups/{group_id}``), or ``unmatched``."""
    path = getattr(scope.get("route"), "path", None)
    return _CONVERTOR.sub(r"{\1}", path) if path else UNMATCHED


def method_label(method: str) -> str:
    """The ``method`` label: one of ``METHODS`` or ``other``."""
    return method if method in METHODS else OTHER_METHOD


def _lease_result(status: int) -> str:
    return "batch" if status == 200 else "empty" if status == 204 else "error"


class RequestMetricsMiddleware:
    """Times every HTTP request; the route template is read from the scope after routing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed = time.perf_counter() - start
            route = route_label(scope)
            HTTP_DURATION.labels(method_label(scope["method"]), route, str(status)).observe(elapsed)
            if route == LEASE_ROUTE:
                LEASE_WAIT.labels(_lease_result(status)).observe(elapsed)


def observe_components(kinds: Mapping[str, str], results: Iterable[Mapping[str, object]],
                       path: str = "worker") -> None:
    """Record component runs: ``kinds`` {component name: kind}; ``results`` per sample {name: result}
    where a result has ``latency_ms`` and ``error`` (``reward_models.base.ComponentResult``); ``path``: one
    of ``SCORING_PATHS``. A spec's components are all labelled, ok and error both, from their first run, so
    an error rate reads 0 (not "no data") while nothing fails."""
    if path not in SCORING_PATHS:
        raise ValueError(f"path: expected one of {', '.join(SCORING_PATHS)}, got {path!r}")
    for per_sample in results:
        for name, result in per_sample.items():
            kind = kinds.get(name, "unknown")
            COMPONENT_LATENCY.labels(kind, name, path).observe(float(getattr(result, "latency_ms", 0.0)) / 1000.0)
            failed = getattr(result, "error", None) is not None
            COMPONENT_RESULTS.labels(kind, name, "error", path)  # the error series exists (at 0) from the first run
            COMPONENT_RESULTS.labels(kind, name, "error" if failed else "ok", path).inc()


def process_text() -> bytes:
    """This process's metrics in the Prometheus text format."""
    return generate_latest(REGISTRY)


def serve_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Serve this process's metrics on ``port`` (a score worker has no API of its own)."""
    start_http_server(port, addr=addr, registry=REGISTRY)


# training-health monitors (service.alerts): 0 ok, 1 warning, 2 critical, per monitor and scope (dataset ""
# = every dataset together); set by the process that evaluates or resolves (the API with its embedded
# worker, or a score worker on its --metrics-port), from the stored alerts, so every series is complete
MONITOR_STATE = Gauge(
    "grpo_curator_monitor_state",
    "training-health monitor state: 0 ok, 1 warning, 2 critical (dataset '' = every dataset together)",
    ["monitor", "dataset"],
    registry=REGISTRY,
)
MONITOR_STATE_VALUES = {"ok": 0, "warning": 1, "critical": 2}


def set_monitor_states(states: Mapping[tuple[str, str], str]) -> None:
    """(monitor, dataset or '') -> 'ok' | 'warning' | 'critical'; scopes no longer named go back to ok."""
    for labels in list(MONITOR_STATE._metrics):  # noqa: SLF001 - the label sets this process exported
        if labels not in states:
            MONITOR_STATE.labels(*labels).set(0)
    for (monitor, dataset), state in states.items():
        MONITOR_STATE.labels(monitor, dataset).set(MONITOR_STATE_VALUES[state])

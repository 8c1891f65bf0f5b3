"""``grpo-curator score-worker``: a score / curate worker process, and the in-process worker thread."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from reward_models.sandbox_backend import describe_backend
from reward_models.sandbox_settings import get_sandbox_settings
from reward_models.scoring import Scorer
from service.archive.service import start_schedule as start_archive
from service.observability.metrics import serve_metrics
from service.settings import Settings, get_settings
from service.store.db import get_engine, make_sessionmaker, worker_engine
from service.worker.pipeline import PipelineConfig, run_forever

log = logging.getLogger(__name__)


class WorkerThread:
    """The worker inside the API process (the embedded default needs no other process)."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings = settings
        self.factory = make_sessionmaker(worker_engine(url, settings))  # bounded transactions (worker_options)
        self.url = url
        self.stop = threading.Event()
        self.scorer: Scorer | None = None
        self.thread = threading.Thread(target=self._run, name="score-worker", daemon=True)

    def _run(self) -> None:
        s = self.settings
        start_archive(get_engine(self.url), s, self.stop)
        log.info("code sandbox: %s", describe_backend(get_sandbox_settings()))
        self.scorer = Scorer(processes=s.worker_processes, timeout_s=s.component_timeout_s, memory_mb=s.component_memory_mb,
                             judge_endpoints=s.judge_endpoints)
        try:
            run_forever(self.factory, self.scorer, self.stop, PipelineConfig.from_settings(s),
                        poll_seconds=s.worker_poll_seconds)
        finally:
            self.scorer.close()

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


class StopOnSignals:
    """``StopOnSignals(stop)``: SIGTERM / SIGINT / SIGHUP (the last two unless inherited as ignored: ``nohup``,
    a shell's background job) set ``stop`` from now on (``signum`` says which came); until
    ``started()`` they also raise SystemExit(128 + signal), so a stop during start-up (a migration, say) does
    not wait for it to finish.

    The flag is what counts: a SystemExit raised while a ``__del__`` or a weakref callback happens to run is
    printed and dropped by Python, and a worker that relied on it alone kept running after its one SIGTERM
    (seen under load: a ``kill`` during start-up, the worker still polling an hour later). With the flag set
    the first loop check ends it."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop, self.starting, self.signum = stop, True, 0
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            # an interrupt or a hang-up the parent has this process ignore stays ignored (a shell's `cmd &`
            # ignores SIGINT, `nohup` SIGHUP): before this line Python had ignored it anyway, so catching it
            # from here on would make its effect depend on when it came
            if sig != signal.SIGTERM and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signum = signum
        self.stop.set()
        if self.starting:
            raise SystemExit(128 + signum)

    def started(self) -> None:
        self.starting = False


def main(argv: list[str] | None = None) -> int:
    stop = threading.Event()
    signals = StopOnSignals(stop)  # first: a signal that comes while this starts is never lost
    settings = get_settings()
    parser = argparse.ArgumentParser(prog="grpo-curator score-worker", description=__doc__)
    parser.add_argument("--processes", type=int, default=settings.worker_processes, help="verifier processes")
    parser.add_argument("--batch", type=int, default=settings.worker_batch_groups, help="groups per transaction")
    parser.add_argument("--timeout", type=float, default=settings.component_timeout_s, help="seconds per component")
    parser.add_argument("--memory-mb", type=int, default=settings.component_memory_mb)
    parser.add_argument("--metrics-port", type=int, default=settings.worker_metrics_port,
                        help="serve Prometheus metrics (component latency / errors) on this port")
    args = parser.parse_args(argv)
    if args.metrics_port:
        serve_metrics(args.metrics_port)
    from service.store.db import resolve_database_url
    from service.store.migrate import upgrade

    url = resolve_database_url(settings)
    upgrade(url)
    log.info("code sandbox: %s", describe_backend(get_sandbox_settings()))
    factory = make_sessionmaker(worker_engine(url, settings))  # bounded transactions (worker_options)
    signals.started()  # from here a signal sets the flag only: the loop ends the pass it is in, then returns
    if stop.is_set():  # a signal came during start-up and its SystemExit was dropped (see StopOnSignals)
        return 128 + signals.signum
    start_archive(get_engine(url), settings, stop)
    log.info("score-worker: %d verifier processes, batches of %d groups", args.processes, args.batch)
    with Scorer(processes=args.processes, timeout_s=args.timeout, memory_mb=args.memory_mb,
                judge_endpoints=settings.judge_endpoints) as scorer:
        cfg = PipelineConfig.from_settings(settings, batch=args.batch)
        run_forever(factory, scorer, stop, cfg, poll_seconds=settings.worker_poll_seconds)
    return 0

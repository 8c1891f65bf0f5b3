"""The supervisor: brokers one task between the reference's sandbox and the candidate's, decides the verdict.

Nothing of the reference or the program runs here. The pool worker only moves frames and keeps the clock:

- ``run_function_tests``: the program runs in a ``program`` sandbox, the reference's tests (``check(
  candidate)`` or top-level asserts, HumanEval / MBPP style) and its ``prompt`` in a ``harness`` sandbox
  of their own (``reward_models.harness_runner``: the same isolation, separate namespaces, never
  network or subprocesses). Each call the tests make is forwarded to the program as it is and the
  program's reply back to the tests unread; both sides share one deadline, from *our* clock. The
  verdict is the tests' (``done``), unless the program broke the rules first: it exited, timed out,
  sent a malformed reply or a result that is not plain data (``fatal``), which the tests cannot catch.
  Once the program's results have reached the tests, the time the tests spend on them is the
  program's: running out of it is a timeout (a fail); the tests stopping without a verdict is a fail.
  Before the first call nothing of the program is in the tests, so a hang or crash there is the
  reference's: ``ReferenceProblem``.
- ``run_io_tests``: one fresh child per case; we feed its stdin, read its stdout to the end and
  compare it with the expected output (trailing whitespace per line and trailing blank lines
  ignored); the zygote's ``waitpid`` says whether it exited 0. No reference code runs at all.
- ``run_in_process``: solution and tests in the program's own interpreter (``mode:
  "trusted_tests_in_process"``): the program can forge its verdict there, so it is never the default.

A program that leaves its sandbox in a state the zygote cannot wipe fails (and the next task gets a
fresh sandbox). Sandbox failures raise ``SandboxError``; the reference's own failures (tests, prompt,
arguments) ``ReferenceProblem``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

from reward_models.sandbox import (
    MAX_LISTING_BYTES,
    Channel,
    ChannelBroken,
    ChannelTimeout,
    Sandbox,
    SandboxLimits,
    checkout,
)
from reward_models.sandbox_backend import SandboxError

Verdict = Literal["passed", "failed", "timeout"]
_MAX_NAMES = 10_000
_HARNESS_MIN_MB = 256  # the tests' interpreter needs room of its own; what it spends is still bounded
# What the supervisor parses itself is small: the program's listing and in-process reply, the tests'
# control messages. The calls and replies it only forwards (up to MAX_FRAME_BYTES) are never parsed here.
_MAX_CONTROL_BYTES = MAX_LISTING_BYTES
MESSY = "the program left files the sandbox could not remove"


class ReferenceProblem(ValueError):
    """The reference (tests, entry point, io cases) cannot be run as given: an error, not a 0."""


class CandidateAborted(Exception):  # noqa: N818 - control flow inside the supervisor only
    """The program can no longer answer: it exited, timed out, or broke the protocol."""


@dataclass(slots=True)
class Outcome:
    """What the harness decided, with what it saw."""

    verdict: Verdict
    reason: str = ""
    calls: int = 0
    exit: int | None = None
    output: str = ""
    extra: dict = field(default_factory=dict)


class _TestsStopped(Exception):  # noqa: N818 - control flow inside the supervisor only
    """The tests' channel went quiet or closed without a verdict; judged once their exit status is known."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Session:
    """The program's side of one task; remembers the first fatal problem.

    ``calls`` counts the program's replies that reached the tests (not the calls forwarded): only
    then is anything of the program in the tests. ``pending`` is True while a call is with the
    program: the tests are waiting, doing nothing, so if they die then, it is not the program's doing.
    """

    def __init__(self, channel: Channel, timeout_s: float = 0.0) -> None:
        self.channel, self.calls, self.timeout_s = channel, 0, timeout_s
        self.pending = False
        self.fatal: Outcome | None = None
        self.listed_after = 0.0  # seconds of the task the program took to list its functions

    def abort(self, verdict: Verdict, reason: str) -> CandidateAborted:
        if self.fatal is None:
            self.fatal = Outcome(verdict, reason)
        return CandidateAborted(self.fatal.reason)

    def request(self, message: dict) -> dict:
        """Send one frame and read the reply (at most _MAX_CONTROL_BYTES) as a JSON object, aborting on
        anything else: what the program makes the supervisor parse, and any resource it costs, is the
        program's, never an error."""
        reply = self._exchange(json.dumps(message, separators=(",", ":")).encode(), _MAX_CONTROL_BYTES)
        try:
            parsed = json.loads(reply)
        except (ValueError, RecursionError, MemoryError):
            raise self.abort("failed", "the program sent a malformed message") from None
        if not isinstance(parsed, dict):
            raise self.abort("failed", "the program sent a malformed message")
        return parsed

    def forward(self, call: bytes) -> bytes:
        """One call of the tests, as the tests encoded it; the program's reply, unread."""
        self.pending = True
        return self._exchange(call)

    def delivered(self) -> None:
        """The program's reply reached the tests."""
        self.pending = False
        self.calls += 1

    def _exchange(self, data: bytes, limit: int | None = None) -> bytes:
        if self.fatal is not None:
            raise CandidateAborted(self.fatal.reason)
        try:
            self.channel.send_encoded(data)
            return self.channel.recv() if limit is None else self.channel.recv(limit)
        except ChannelTimeout:
            raise self.abort("timeout", "the time limit passed") from None
        except ChannelBroken as exc:
            raise self.abort("failed", str(exc)) from None
        except MemoryError:
            reason = "the program's message did not fit in the supervisor's memory"
            raise self.abort("failed", reason) from None


def _names(listed: Any) -> list[str]:
    """The names the program listed (what it sends is untrusted: anything else counts as none)."""
    if type(listed) is not list:
        return []
    return [n for n in listed if type(n) is str and n.isidentifier()][:_MAX_NAMES]


def _tests_stopped(session: _Session, exc: Exception) -> NoReturn:
    """The tests' sandbox went quiet or away without a verdict: decided by ``_judge_stop`` once the
    harness's exit status is known."""
    raise _TestsStopped(exc)


def _judge_stop(session: _Session, exc: Exception, harness_exit: int | None) -> Outcome:
    """Who stopped the tests. Killed by a signal while they were waiting for the program's reply:
    nothing of that reply had reached them, so it is the environment's doing (an error, never 0)."""
    timeout = isinstance(exc, ChannelTimeout)
    if not timeout and session.pending and harness_exit is not None and harness_exit < 0:
        raise SandboxError(
            f"the tests' sandbox was killed (signal {-harness_exit}) while the tests waited for the "
            "program's reply"
        )
    if session.calls == 0:  # nothing of the program is in the tests yet: the reference's own fault...
        if not timeout:
            raise ReferenceProblem(f"the tests stopped before calling the program ({exc})")
        if session.listed_after <= session.timeout_s / 2:  # ...when they had the time to reach a call
            raise ReferenceProblem("the tests ran past the time limit before calling the program")
        return Outcome("timeout", "the time limit passed: the program took most of it before the tests ran")
    if timeout:
        return Outcome("timeout", "the time limit passed while the tests worked on the program's results")
    return Outcome("failed", f"the tests stopped without a verdict after the program's results ({exc})")


def _verdict(session: _Session, body: bytes) -> Outcome:
    """The tests' control message: their verdict, the program's foul, or a problem of the reference."""
    try:
        if len(body) > _MAX_CONTROL_BYTES:
            raise ValueError("too big")
        message = json.loads(body)
        op, reason = message["op"], str(message.get("reason", ""))[:2000]
    except (ValueError, TypeError, KeyError, RecursionError, MemoryError):
        return _tests_stopped(session, ChannelBroken("the tests sent a malformed message"))
    if op == "done":
        return Outcome("passed" if message.get("verdict") == "passed" else "failed", reason)
    if op == "fatal":
        session.abort("failed", reason)
        return session.fatal  # type: ignore[return-value]
    if op == "reference_problem":
        raise ReferenceProblem(reason)
    return _tests_stopped(session, ChannelBroken(f"the tests sent an unknown message {op!r}"))


def _after_broken_send(session: _Session, tests: Channel, exc: Exception) -> Outcome:
    """A send to the tests failed: they may have ended with a message already on its way (a broken
    reference says so, then exits); read it before blaming anyone."""
    if isinstance(exc, ChannelBroken):
        try:
            frame = tests.recv()
        except (ChannelTimeout, ChannelBroken):
            frame = b""
        if frame[:1] == b"M":
            return _verdict(session, frame[1:])
    return _tests_stopped(session, exc)


def _broker(session: _Session, tests: Channel) -> Outcome:
    """Move the tests' calls to the program and its replies back until someone decides."""
    while True:
        try:
            frame = tests.recv()
        except (ChannelTimeout, ChannelBroken) as exc:
            return _tests_stopped(session, exc)
        if frame[:1] != b"C":
            return _verdict(session, frame[1:])
        try:
            reply = session.forward(frame[1:])
        except CandidateAborted:
            return session.fatal  # type: ignore[return-value]
        try:
            tests.send_encoded(reply)
        except (ChannelTimeout, ChannelBroken) as exc:
            return _after_broken_send(session, tests, exc)
        session.delivered()


def _harness_limits(limits: SandboxLimits) -> SandboxLimits:
    return SandboxLimits(
        timeout_s=limits.timeout_s,
        memory_mb=max(limits.memory_mb, _HARNESS_MIN_MB),
        max_processes=limits.max_processes,
        max_file_mb=limits.max_file_mb,
        max_output_bytes=2000,
    )


@contextmanager
def _harness_for(sandbox: Sandbox, harness: Sandbox | None) -> Iterator[Sandbox]:
    if harness is not None:
        yield harness
    else:
        with checkout(sandbox.settings, role="harness") as fresh:
            yield fresh


def run_function_tests(
    sandbox: Sandbox,
    limits: SandboxLimits,
    source: str,
    tests: str,
    entry_point: str | None,
    prompt: str | None = None,
    harness: Sandbox | None = None,
) -> Outcome:
    """Define the program's functions in ``sandbox``, run ``prompt`` (the reference's helpers) then
    ``tests`` in ``harness`` (a harness sandbox; checked out here when None) against proxies."""
    with _harness_for(sandbox, harness) as harness:
        channel = sandbox.task("fn", limits)
        tests_channel = harness.task("harness", _harness_limits(limits))
        tests_channel.deadline = channel.deadline  # one clock for the task, both sides
        session = _Session(channel, limits.timeout_s)
        setup = {"tests": tests, "prompt": prompt, "entry_point": entry_point}
        stopped: _TestsStopped | None = None
        try:
            outcome = _start(session, tests_channel, source, setup)
        except ReferenceProblem as exc:
            _, tests_done = _end(sandbox, channel, harness, tests_channel)
            raise ReferenceProblem(f"{exc}{_tests_wrote(tests_done)}") from None
        except _TestsStopped as exc:
            stopped = exc
        done, tests_done = _end(sandbox, channel, harness, tests_channel)
        if stopped is not None:
            try:
                outcome = _judge_stop(session, stopped.cause, tests_done.get("exit"))
            except ReferenceProblem as exc:
                raise ReferenceProblem(f"{exc}{_tests_wrote(tests_done)}") from None
        outcome.calls = session.calls
        return _observed(outcome, done)


def _tests_wrote(tests_done: dict) -> str:
    tail = str(tests_done.get("output", "")).strip()[-500:]
    return "; the tests wrote: " + tail if tail else ""


def _start(session: _Session, tests: Channel, source: str, setup: dict) -> Outcome:
    try:
        tests.send(setup)
    except (ChannelTimeout, ChannelBroken) as exc:
        raise ReferenceProblem(f"the tests' sandbox did not take the reference ({exc})") from None
    session.pending = True  # the tests wait for the program's listing
    try:
        first = session.request({"source": source})
    except CandidateAborted:
        return session.fatal  # type: ignore[return-value]
    if not ("defined" in first and isinstance(first["defined"], list)):
        return Outcome("failed", f"the program raised before the tests: {str(first.get('error', '?'))[:2000]}")
    session.listed_after = session.timeout_s - session.channel.remaining()
    try:
        tests.send({"defined": _names(first["defined"]), "own": _names(first.get("own"))})
    except (ChannelTimeout, ChannelBroken) as exc:
        return _after_broken_send(session, tests, exc)
    session.pending = False
    return _broker(session, tests)


def _end(sandbox: Sandbox, channel: Channel, harness: Sandbox, tests: Channel) -> tuple[dict, dict]:
    """Stop both sides at once; (the program's finish report, the tests' finish report)."""
    harness.stop(tests, kill=True)
    sandbox.stop(channel, kill=True)
    try:
        tests_done = harness.finished()
    finally:
        done = sandbox.finished()
    return done, tests_done


def _observed(outcome: Outcome, done: dict) -> Outcome:
    """Add what the zygote saw at the end; a program that left an unremovable mess fails."""
    outcome.exit, outcome.output = done.get("exit"), str(done.get("output", ""))
    if done.get("clean") is False and outcome.verdict == "passed":
        outcome.verdict, outcome.reason = "failed", MESSY
    return outcome


def normalize_output(text: str) -> str:
    """Judge-style comparison form: trailing whitespace per line and trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def _io_case(
    sandbox: Sandbox, limits: SandboxLimits, source: str, stdin: str, expected: str, deadline: float
) -> Outcome:
    channel = sandbox.task("io", limits)
    channel.deadline = min(channel.deadline, deadline)
    cap = max(4 * len(expected.encode()) + 4096, 65536)
    data, complete, outcome = b"", False, None
    try:
        channel.send({"source": source})
        writer = threading.Thread(target=_feed, args=(channel, stdin.encode()), daemon=True)
        writer.start()
        data, complete = channel.read_until_eof(cap)
        if not complete:
            outcome = Outcome("failed", f"the program wrote more than {cap} bytes")
    except ChannelTimeout:
        outcome = Outcome("timeout", "the time limit passed")
    except ChannelBroken as exc:
        outcome = Outcome("failed", str(exc))
    outcome = _observed(outcome or Outcome("passed"), sandbox.finish(channel, kill=not complete))
    if outcome.verdict == "passed" and outcome.exit != 0:
        outcome.verdict, outcome.reason = "failed", f"the program exited with status {outcome.exit}"
    elif outcome.verdict == "passed" and normalize_output(
        data.decode("utf-8", "replace")
    ) != normalize_output(expected):
        outcome.verdict, outcome.reason = "failed", "wrong output"
    return outcome


def _feed(channel: Channel, data: bytes) -> None:
    try:
        channel.send_raw(data)
    except (ChannelTimeout, ChannelBroken, OSError):
        pass  # the program stopped reading: what it wrote decides


def run_io_tests(sandbox: Sandbox, limits: SandboxLimits, source: str, cases: list[tuple[str, str]]) -> Outcome:
    """Run the program once per ``(stdin, expected stdout)`` case, all within ``limits.timeout_s``.
    A case after which the sandbox had to be replaced has failed, so no case runs in a closed one."""
    deadline = time.monotonic() + limits.timeout_s
    outcome = Outcome("passed")
    for index, (stdin, expected) in enumerate(cases):
        outcome = _io_case(sandbox, limits, source, stdin, expected, deadline)
        outcome.extra["case"] = index
        if outcome.verdict != "passed":
            break
    outcome.calls = len(cases) if outcome.verdict == "passed" else outcome.extra["case"] + 1
    return outcome


def run_in_process(sandbox: Sandbox, limits: SandboxLimits, source: str, tests: str) -> Outcome:
    """Solution then tests in the program's interpreter (forgeable: only by explicit choice)."""
    channel = sandbox.task("inproc", limits)
    session = _Session(channel)
    try:
        reply = session.request({"source": source, "tests": tests})
        outcome = (
            Outcome("passed")
            if reply.get("finished") is True
            else Outcome("failed", "the tests did not finish")
        )
    except CandidateAborted:
        outcome = session.fatal or Outcome("failed", "the program stopped")
    return _observed(outcome, sandbox.finish(channel, kill=True))

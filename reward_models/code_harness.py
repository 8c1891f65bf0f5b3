"""The trusted harness: runs the reference's tests here and the candidate program in a sandbox.

- ``run_function_tests``: the tests (``check(candidate)`` or top-level asserts, HumanEval / MBPP
  style) are exec'd in this process with a proxy for each function the program defined; every call
  crosses into the sandbox with plain-data arguments and comes back as a plain-data result
  (``reward_models.plaindata``). The verdict is decided here, from our clock and what we received.
- ``run_io_tests``: one fresh child per case; we feed its stdin, read its stdout to the end and
  compare it with the expected output (trailing whitespace per line and trailing blank lines
  ignored); the zygote's ``waitpid`` says whether it exited 0.
- ``run_in_process``: solution and tests in the program's own interpreter (``mode:
  "trusted_tests_in_process"``): the program can forge its verdict there, so it is never the default.

A program that exits, is killed, times out, returns something that is not plain data, or breaks the
protocol fails; a candidate's *exception* is re-raised in the tests as the same built-in class when
it is an ordinary data error (``DATA_EXCEPTIONS``: ValueError, KeyError, ...), so tests may expect
it; any other (``StopIteration`` would silently end a ``map()`` in the tests) becomes
``CandidateError``. Helpers defined by the trusted ``reference.prompt`` are exec'd here first and
are the ones the tests call: the program cannot redefine them. Sandbox failures raise
``SandboxError``; the harness's own failures (tests, prompt, arguments) ``ReferenceProblem``.
"""

from __future__ import annotations

import ast
import builtins
import json
import keyword
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Literal

from reward_models.plaindata import DecodeTimeout, PlainDataError, from_plain, to_plain
from reward_models.sandbox import Channel, ChannelBroken, ChannelTimeout, Sandbox

Verdict = Literal["passed", "failed", "timeout"]


class ReferenceProblem(ValueError):
    """The reference (tests, entry point, io cases) cannot be run as given: an error, not a 0."""


class CandidateAborted(BaseException):  # noqa: N818 - BaseException: tests' "except Exception" cannot swallow it
    """The program can no longer answer: it exited, timed out, or sent something that is not plain data."""


class CandidateError(Exception):
    """The candidate raised an exception that is not a built-in one."""


@dataclass(slots=True)
class Outcome:
    """What the harness decided, with what it saw."""

    verdict: Verdict
    reason: str = ""
    calls: int = 0
    exit: int | None = None
    output: str = ""
    extra: dict = field(default_factory=dict)


class _Session:
    """The calls of one function-style task; remembers the first fatal problem."""

    def __init__(self, channel: Channel) -> None:
        self.channel, self.calls = channel, 0
        self.fatal: Outcome | None = None

    def abort(self, verdict: Verdict, reason: str) -> CandidateAborted:
        if self.fatal is None:
            self.fatal = Outcome(verdict, reason)
        return CandidateAborted(self.fatal.reason)

    def request(self, message: dict) -> dict:
        """Send one frame and read the reply as a JSON object, aborting on anything else."""
        if self.fatal is not None:
            raise CandidateAborted(self.fatal.reason)
        try:
            data = json.dumps(message, separators=(",", ":")).encode()
        except (ValueError, RecursionError) as exc:  # ours, never the program's fault
            raise ReferenceProblem(f"the harness could not encode a message: {exc}") from None
        try:
            self.channel.send_encoded(data)
            reply = json.loads(self.channel.recv())
        except ChannelTimeout:
            raise self.abort("timeout", "the time limit passed") from None
        except ChannelBroken as exc:
            raise self.abort("failed", str(exc)) from None
        except (ValueError, RecursionError):
            raise self.abort("failed", "the program sent a malformed message") from None
        if not isinstance(reply, dict):
            raise self.abort("failed", "the program sent a malformed message")
        return reply

    def call(self, name: str, args: tuple, kwargs: dict) -> Any:
        try:
            message = {"fn": name, "args": to_plain(args), "kwargs": to_plain(kwargs)}
        except PlainDataError as exc:
            raise ReferenceProblem(f"the tests pass an argument that is not plain data: {exc}") from None
        self.calls += 1
        reply = self.request(message)
        if "value" in reply:
            try:
                value = from_plain(reply["value"], deadline=self.channel.deadline)
            except DecodeTimeout:
                raise self.abort("timeout", "the time limit passed (decoding the result)") from None
            except PlainDataError as exc:
                raise self.abort(
                    "failed", f"{name} returned something that is not plain data: {exc}"
                ) from None
            if self.channel.remaining() <= 0:  # our clock, decoding included
                raise self.abort("timeout", "the time limit passed")
            return value
        if "raised" in reply:
            raise _candidate_exception(str(reply["raised"]), str(reply.get("message", "")))
        reason = reply.get("not_plain", "a malformed reply")
        raise self.abort("failed", f"{name} returned something that is not plain data: {reason}")


# Re-created in the tests as themselves. Never control-flow exceptions: a StopIteration raised in
# map() / filter() / next() ends the *tests'* iteration and makes all(map(...)) True.
DATA_EXCEPTIONS = frozenset(
    {
        "ArithmeticError", "AttributeError", "FloatingPointError", "IndexError", "KeyError",
        "LookupError", "NameError", "NotImplementedError", "OverflowError", "RecursionError",
        "RuntimeError", "TypeError", "UnboundLocalError", "ValueError", "ZeroDivisionError",
    }
)  # fmt: skip


def _candidate_exception(name: str, message: str) -> Exception:
    """The built-in exception of that name when it is a data error (so tests can expect it), else
    CandidateError."""
    if name in DATA_EXCEPTIONS:
        return getattr(builtins, name)(message)
    return CandidateError(f"{name}: {message}")


class CandidateFunction:
    """Stands for one function of the program in the tests' namespace."""

    def __init__(self, session: _Session, name: str) -> None:
        self._session, self.__name__ = session, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<candidate function {self.__name__}>"


def _pick_candidate(
    proxies: dict[str, CandidateFunction], own: list[str], entry_point: str | None
) -> CandidateFunction | None:
    """The entry point, else the one function the program wrote (imports do not count)."""
    if entry_point is not None:
        return proxies.get(entry_point)
    return proxies[own[0]] if len(own) == 1 and own[0] in proxies else None


def _names(listed: Any) -> list[str]:
    """The names the program listed (what it sends is untrusted: anything else counts as none)."""
    return [n for n in listed if type(n) is str] if type(listed) is list else []


def _stubs(tree: ast.Module) -> set[str]:
    """Top-level functions of the prompt with no body but a docstring / ``pass`` / ``...``: the ones
    the program is asked to write (they come from the program; complete ones are trusted)."""
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and all(
            isinstance(stmt, ast.Pass)
            or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
            for stmt in node.body
        )
    }


def _trusted_module(prompt: str | None) -> tuple[types.ModuleType, set[str]]:
    """The tests' module holding what the trusted prompt defines (helpers the tests call), and the
    names of the prompt's stubs."""
    module = types.ModuleType("__main__")  # unittest.main() looks for its tests in __main__
    if not prompt:
        return module, set()
    try:
        tree = ast.parse(prompt, "<prompt>")
        exec(compile(tree, "<prompt>", "exec"), module.__dict__)  # noqa: S102 - the reference's: trusted
    except Exception as exc:  # noqa: BLE001 - a broken reference is an error, not a verdict
        raise ReferenceProblem(f"reference.prompt cannot be run: {type(exc).__name__}: {exc}") from None
    return module, _stubs(tree)


def _visible(name: str, entry_point: str | None) -> bool:
    """May the tests see this program function by name? Never as a builtin (``def abs(x): return 0``
    would rig ``abs(candidate(x) - y) < 1e-6``), a dunder or a keyword, unless it is the entry point."""
    if name == entry_point:
        return True
    return not (name.startswith("__") or hasattr(builtins, name) or keyword.iskeyword(name))


def _run_tests(
    session: _Session, tests: str, listed: dict, entry_point: str | None, prompt: str | None
) -> Outcome:
    names, own = (_names(listed.get(key)) for key in ("defined", "own"))
    proxies = {name: CandidateFunction(session, name) for name in names if name.isidentifier()}
    candidate = _pick_candidate(proxies, own, entry_point)
    if entry_point is not None and candidate is None:
        return Outcome("failed", f"the program does not define {entry_point}()")
    module, stubs = _trusted_module(prompt)
    trusted = set(module.__dict__) - stubs  # the prompt's complete definitions win over the program's
    module.__dict__.update(
        (name, proxy)
        for name, proxy in proxies.items()
        if name == entry_point or (_visible(name, entry_point) and name not in trusted)
    )
    namespace: dict[str, Any] = module.__dict__
    try:
        code = compile(tests, "<tests>", "exec")
    except SyntaxError as exc:
        raise ReferenceProblem(f"reference tests do not compile: {exc}") from None
    saved = sys.argv, sys.modules["__main__"]
    sys.argv, sys.modules["__main__"] = ["tests"], module  # one task at a time per harness process
    try:
        exec(code, namespace)  # noqa: S102 - the reference's tests: trusted, and never the program's code
        check = namespace.get("check")
        if callable(check) and not isinstance(check, CandidateFunction):  # the tests' own check
            if candidate is None:
                return Outcome(
                    "failed",
                    f"check(candidate) needs one entry point; the program defines {len(own)} functions (set reference.entry_point)",
                )
            check(candidate)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return Outcome("failed", f"the tests exited with {exc.code!r}")
    except (CandidateAborted, Exception) as exc:  # noqa: BLE001 - any failure of the tests is a fail
        if isinstance(exc, ReferenceProblem):
            raise
        return session.fatal or Outcome("failed", _test_failure(exc))
    finally:
        sys.argv, sys.modules["__main__"] = saved
    return session.fatal or Outcome("passed")


def _test_failure(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    where = f" (tests line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}{where}: {str(exc)[:500]}"


def _finish(sandbox: Sandbox, channel: Channel, outcome: Outcome, kill: bool = True) -> Outcome:
    done = sandbox.finish(channel, kill)
    outcome.exit, outcome.output = done.get("exit"), str(done.get("output", ""))
    return outcome


def run_function_tests(
    sandbox: Sandbox,
    limits: Any,
    source: str,
    tests: str,
    entry_point: str | None,
    prompt: str | None = None,
) -> Outcome:
    """Define the program's functions in the sandbox, run ``prompt`` (trusted helpers) then
    ``tests`` here against proxies."""
    channel = sandbox.task("fn", limits)
    session = _Session(channel)
    try:
        first = session.request({"source": source})
        if "defined" in first and isinstance(first["defined"], list):
            outcome = _run_tests(session, tests, first, entry_point, prompt)
        else:
            outcome = Outcome("failed", f"the program raised before the tests: {first.get('error', '?')}")
    except CandidateAborted:
        outcome = session.fatal or Outcome("failed", "the program stopped")
    except ReferenceProblem:
        sandbox.finish(channel, kill=True)
        raise
    outcome.calls = session.calls
    return _finish(sandbox, channel, outcome)


def normalize_output(text: str) -> str:
    """Judge-style comparison form: trailing whitespace per line and trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def _io_case(
    sandbox: Sandbox, limits: Any, source: str, stdin: str, expected: str, deadline: float
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
    outcome = _finish(sandbox, channel, outcome or Outcome("passed"), kill=not complete)
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


def run_io_tests(sandbox: Sandbox, limits: Any, source: str, cases: list[tuple[str, str]]) -> Outcome:
    """Run the program once per ``(stdin, expected stdout)`` case, all within ``limits.timeout_s``."""
    deadline = time.monotonic() + limits.timeout_s
    outcome = Outcome("passed")
    for index, (stdin, expected) in enumerate(cases):
        outcome = _io_case(sandbox, limits, source, stdin, expected, deadline)
        outcome.extra["case"] = index
        if outcome.verdict != "passed":
            break
    outcome.calls = len(cases) if outcome.verdict == "passed" else outcome.extra["case"] + 1
    return outcome


def run_in_process(sandbox: Sandbox, limits: Any, source: str, tests: str) -> Outcome:
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
    return _finish(sandbox, channel, outcome)

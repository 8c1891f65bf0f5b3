"""The reference's side of a function-style task: runs *inside the harness sandbox* (standard library only).

The reference (``reference.prompt`` and ``reference.tests``) is trusted to decide the verdict but not
with the host: it runs in a sandbox of its own, with the candidate's isolation and a separate set of
namespaces. ``run_harness`` gets one socket to the supervisor (the pool worker), which brokers its
calls to the candidate's sandbox:

- supervisor -> harness: ``{"tests", "prompt", "entry_point"}``, then ``{"defined", "own"}`` (the
  program's callables, checked), then one reply per call: the candidate's own reply frame, unread by
  the supervisor (``{"value"}``, ``{"raised", "message"}``, ``{"not_plain"}`` or anything at all);
- harness -> supervisor: ``C`` + ``{"fn", "args", "kwargs"}`` (a call, forwarded to the candidate as
  it is: arguments are encoded one by one, so whatever the program returned can go back to it), and
  ``M`` + ``{"op": "done", "verdict", "reason"}`` / ``{"op": "fatal", "reason"}`` (the program broke
  the rules: a fail the tests cannot catch) / ``{"op": "reference_problem", "reason"}``.

Decoding the program's results, and whatever the tests do with them, runs on the supervisor's clock:
a result that makes the tests slow (hash collisions fed to ``set()``, a huge int squared) is the
program's timeout. The names and rules of the old in-worker harness hold here unchanged: helpers the
prompt defines win over the program's, program functions never shadow builtins, a candidate's data
error is re-raised as the same built-in class and anything else as ``CandidateError``.
"""

import ast
import builtins
import json
import keyword
import struct
import sys
import traceback
import types

if __name__ != "__main__":  # imported on the host; in the sandbox the codec's source comes first
    from reward_models.plaindata import PlainDataError, TooDeep, from_plain, to_plain

_FRAME = struct.Struct(">I")
MAX_CALL_BYTES = 16 * 2**20  # the supervisor's frame limit


class ReferenceProblem(ValueError):
    """The reference (tests, prompt, entry point) cannot be run as given: an error, not a 0."""


class CandidateAborted(BaseException):  # noqa: N818 - BaseException: tests' "except Exception" cannot swallow it
    """The program broke the rules (a result that is not plain data, a malformed reply)."""


class CandidateError(Exception):
    """The candidate raised an exception that is not a built-in data error."""


# Re-created in the tests as themselves. Never control-flow exceptions: a StopIteration raised in
# map() / filter() / next() ends the *tests'* iteration and makes all(map(...)) True.
DATA_EXCEPTIONS = frozenset(
    {
        "ArithmeticError", "AttributeError", "FloatingPointError", "IndexError", "KeyError",
        "LookupError", "NameError", "NotImplementedError", "OverflowError", "RecursionError",
        "RuntimeError", "TypeError", "UnboundLocalError", "ValueError", "ZeroDivisionError",
    }
)  # fmt: skip


def _send(sock, kind, obj):
    body = kind + json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_FRAME.pack(len(body)) + body)


def _recv(sock):
    def exact(n):
        chunks = []
        while n:
            chunk = sock.recv(min(n, 1 << 20))
            if not chunk:
                raise EOFError("the supervisor closed the channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    return exact(_FRAME.unpack(exact(_FRAME.size))[0])


def _candidate_exception(name, message):
    if name in DATA_EXCEPTIONS:
        return getattr(builtins, name)(message)
    return CandidateError(f"{name}: {message}")


class Session:
    """The calls of one task, over the socket to the supervisor; the first fatal problem ends it."""

    def __init__(self, sock):
        self.sock, self.calls, self.fatal = sock, 0, None
        self.replies = 0  # the program's replies that reached the tests: before the first, nothing of it has

    def abort(self, reason):
        if self.fatal is None:
            self.fatal = reason
            _send(self.sock, b"M", {"op": "fatal", "reason": reason[:2000]})
        return CandidateAborted(self.fatal)

    def call(self, name, args, kwargs):
        if self.fatal is not None:
            raise CandidateAborted(self.fatal)
        try:
            message = {
                "fn": name,
                "args": [to_plain(arg) for arg in args],
                "kwargs": [[key, to_plain(value)] for key, value in kwargs.items()],
            }
            body = json.dumps(message, separators=(",", ":")).encode()
        except TooDeep as exc:
            raise self._too_big(f"nested deeper than allowed ({exc})") from None
        except (PlainDataError, ValueError, RecursionError) as exc:  # a type: the tests' own doing
            raise ReferenceProblem(f"the tests pass an argument that is not plain data: {exc}") from None
        if len(body) > MAX_CALL_BYTES:
            raise self._too_big(f"{len(body)} bytes (limit {MAX_CALL_BYTES})")
        self.calls += 1
        self.sock.sendall(_FRAME.pack(len(body) + 1) + b"C" + body)
        raw = _recv(self.sock)
        self.replies += 1
        return self._result(name, raw)

    def _too_big(self, what):
        """Arguments too deep or too big to cross: the reference's fault while nothing of the program
        has reached the tests, the program's once its results have (the tests may be passing them
        back, wrapped or doubled)."""
        if self.replies == 0:
            return ReferenceProblem(f"the tests pass arguments that cannot cross: {what}")
        return self.abort(f"the tests could not pass the program's results back to it: {what}")

    def _result(self, name, raw):
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError, MemoryError):
            raise self.abort("the program sent a malformed message (or one too big to decode)") from None
        if type(reply) is not dict:
            raise self.abort("the program sent a malformed message")
        if "value" in reply:
            try:
                return from_plain(reply["value"])
            except (PlainDataError, RecursionError, MemoryError) as exc:
                what = describe_error(exc)
                raise self.abort(f"{name} returned something that is not plain data: {what}") from None
        if "raised" in reply:
            raise _candidate_exception(str(reply["raised"]), str(reply.get("message", ""))[:2000])
        reason = reply.get("not_plain", "a malformed reply")
        raise self.abort(f"{name} returned something that is not plain data: {str(reason)[:2000]}")


class CandidateFunction:
    """Stands for one function of the program in the tests' namespace."""

    def __init__(self, session, name):
        self._session, self.__name__ = session, name

    def __call__(self, *args, **kwargs):
        return self._session.call(self.__name__, args, kwargs)

    def __repr__(self):
        return f"<candidate function {self.__name__}>"


def stubs(tree):
    """Top-level functions of the prompt with no body but a docstring / ``pass`` / ``...``: the ones
    the program is asked to write (they come from the program; complete ones are trusted)."""
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and all(
            isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
            for stmt in node.body
        )
    }


def trusted_module(prompt):
    """The tests' module holding what the prompt defines (helpers the tests call), and the prompt's stubs."""
    module = types.ModuleType("__main__")  # unittest.main() looks for its tests in __main__
    if not prompt:
        return module, set()
    try:
        tree = ast.parse(prompt, "<prompt>")
        exec(compile(tree, "<prompt>", "exec"), module.__dict__)  # noqa: S102 - the reference's, in its sandbox
    except Exception as exc:  # noqa: BLE001 - a broken reference is an error, not a verdict
        raise ReferenceProblem(f"reference.prompt cannot be run: {type(exc).__name__}: {exc}") from None
    return module, stubs(tree)


def visible(name, entry_point):
    """May the tests see this program function by name? Never as a builtin (``def abs(x): return 0``
    would rig ``abs(candidate(x) - y) < 1e-6``), a dunder or a keyword, unless it is the entry point."""
    if name == entry_point:
        return True
    return not (name.startswith("__") or hasattr(builtins, name) or keyword.iskeyword(name))


def describe_error(exc):
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, MemoryError) else str(exc)


def bound_names(code_tree, module):
    """Every name the tests or the prompt bind themselves (assignments, defs, imports, arguments)."""
    names = set(module.__dict__)
    for node in ast.walk(code_tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def program_missing(exc, bound):
    """A NameError in the tests' own code for a name they do not define: one they expected from the
    program (which did not define it, or not as a function). The program's fail."""
    frames = traceback.extract_tb(exc.__traceback__)
    name = getattr(exc, "name", None)
    return (
        type(exc) is NameError
        and isinstance(name, str)
        and name not in bound
        and bool(frames)
        and frames[-1].filename == "<tests>"
    )


def reference_failure(exc):
    """Why tests that raised before any result of the program reached them are the reference's fault."""
    what = test_failure(exc)
    if isinstance(exc, ImportError):
        return (
            f"the tests need a module the harness sandbox does not have ({what}); the harness sandbox has "
            "only the standard library"
        )
    if isinstance(exc, MemoryError):
        return f"the tests ran out of memory before calling the program ({what})"
    return f"the tests raised before calling the program: {what}"


def test_failure(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    where = f" (tests line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}{where}: {str(exc)[:500]}"


def run_tests(session, code, module, prompt_stubs, listing, entry_point, bound=frozenset()):
    """("passed" | "failed", reason) of the tests against proxies of the listed functions. Tests that
    raise before any result of the program reached them (``session.replies == 0``) fail the program
    only by an AssertionError or a NameError for a name they expected from it (``bound``: the names
    the tests and the prompt define themselves); anything else (a missing module, MemoryError, a bug)
    is a ReferenceProblem."""
    names, own = listing["defined"], listing["own"]
    proxies = {name: CandidateFunction(session, name) for name in names}
    if entry_point is not None:
        candidate = proxies.get(entry_point)
        if candidate is None:
            return "failed", f"the program does not define {entry_point}()"
    else:
        candidate = proxies[own[0]] if len(own) == 1 and own[0] in proxies else None
    trusted = set(module.__dict__) - prompt_stubs  # the prompt's complete definitions win over the program's
    module.__dict__.update(
        (name, proxy)
        for name, proxy in proxies.items()
        if name == entry_point or (visible(name, entry_point) and name not in trusted)
    )
    namespace = module.__dict__
    sys.argv, sys.modules["__main__"] = ["tests"], module
    try:
        exec(code, namespace)  # noqa: S102 - the reference's tests, in their sandbox
        check = namespace.get("check")
        if callable(check) and not isinstance(check, CandidateFunction):  # the tests' own check
            if candidate is None:
                return "failed", (
                    f"check(candidate) needs one entry point; the program defines {len(own)} functions "
                    "(set reference.entry_point)"
                )
            check(candidate)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return "failed", f"the tests exited with {exc.code!r}"
    except (CandidateAborted, Exception) as exc:  # noqa: BLE001 - any failure of the tests is a fail
        if isinstance(exc, ReferenceProblem):
            raise
        if session.fatal:
            return "failed", session.fatal
        if session.replies == 0 and not isinstance(exc, (AssertionError, CandidateAborted)):
            if not program_missing(exc, bound):
                raise ReferenceProblem(reference_failure(exc)) from None
        return "failed", test_failure(exc)
    return ("failed", session.fatal) if session.fatal else ("passed", "")


def run_harness(sock):
    """The harness task: set up the reference, run the tests against the program, report the verdict."""
    setup = json.loads(_recv(sock))
    try:
        module, prompt_stubs = trusted_module(setup.get("prompt"))
        try:
            tree = ast.parse(setup["tests"], "<tests>")
            code = compile(tree, "<tests>", "exec")
        except (SyntaxError, ValueError) as exc:
            raise ReferenceProblem(f"reference tests do not compile: {exc}") from None
        bound = bound_names(tree, module)
        listing = json.loads(_recv(sock))
        session = Session(sock)
        entry_point = setup.get("entry_point")
        verdict, reason = run_tests(session, code, module, prompt_stubs, listing, entry_point, bound)
    except ReferenceProblem as exc:
        _send(sock, b"M", {"op": "reference_problem", "reason": str(exc)[:2000]})
        return
    _send(sock, b"M", {"op": "done", "verdict": verdict, "reason": reason})

"""verl: reward functions for verl 0.9's reward loop and for its legacy reward managers.

verl 0.9 (``reward.custom_reward_function``, reward loop managers naive / dapo / limited / ...)::

    reward.custom_reward_function.path=pkg://grpo_curator_integrations.verl
    reward.custom_reward_function.name=compute_score_async
    +reward.custom_reward_function.reward_kwargs.spec=math-r1

``compute_score_async`` is a coroutine: the reward loop awaits it once per sample, and the calls of one
event loop share HTTP requests (every call that arrives while a request is being sent joins the next one),
so a batch of samples costs a few requests, not one each. ``compute_score`` is the same per-sample function
without the sharing (one request per call). verl before 0.9 (``custom_reward_function.*``, managers naive /
batch / dapo / prime): ``compute_score``, or ``compute_score_batch`` with ``reward_model.reward_manager=batch``.

All return ``{"score": total, "<component>": value, ...}`` so verl logs each part. When an item cannot be
scored (a component errored) ``on_error`` decides: ``"raise"`` (default: a ScoringError stops the step) or a
number that replaces the total and the errored components, with ``"reward_error": 1.0`` in the dict.

verl passes no prompt and no token count. The reference is ``extra_info["reference"]`` when given (grpo-curator's
verl export writes the whole reference there), else ``ground_truth``. The prompt is read from
``extra_info["prompt"]`` (a string or chat messages; the verl export writes it), else ``extra_info["question"]`` (what verl's gsm8k / math preprocessing scripts store), else it
is empty. The token count is ``extra_info["num_tokens"]`` when given; else, when the deployment names a local
Hugging Face tokenizer (``tokenizer=`` reward kwarg, or ``GRPO_CURATOR_TOKENIZER``), the number of tokens of
the response text under it; else none is sent (token-length rules then report an error, never a 0).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import orjson

from grpo_curator_integrations._http import Client, ScoringError, Target, jsonable, target, tools_of

_clients: dict[Target, Client] = {}
_tokenizers: dict[str, Any] = {}
_lock = threading.Lock()


def _client(url: str | None, spec: str | None, api_key: str | None) -> Client:
    t = target(url, spec, api_key)
    with _lock:
        if t not in _clients:
            _clients[t] = Client(t)
        return _clients[t]


def _tokenizer(path: str | None) -> Any:
    """The local Hugging Face tokenizer at ``path`` (or ``GRPO_CURATOR_TOKENIZER``), loaded once; None
    when neither names one. Nothing is downloaded: the path must be a local directory."""
    path = path or os.environ.get("GRPO_CURATOR_TOKENIZER") or None
    if path is None:
        return None
    with _lock:
        if path not in _tokenizers:
            if not os.path.isdir(path):
                raise ValueError(f"tokenizer: {path!r} is not a local tokenizer directory (GRPO_CURATOR_TOKENIZER)")
            from transformers import AutoTokenizer

            _tokenizers[path] = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return _tokenizers[path]


def _prompt(extra: dict[str, Any]) -> Any:
    for key in ("prompt", "question"):
        value = extra.get(key)
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(m, dict) for m in value)):
            return value
    return ""


def _reference(truth: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """``extra_info["reference"]`` (the whole reference, as grpo-curator's verl export writes it: JSON text or
    an object), else ``ground_truth`` (an object as it is, anything else as the answer)."""
    given = extra.get("reference")
    if isinstance(given, str):
        try:
            given = orjson.loads(given)
        except orjson.JSONDecodeError:
            given = None
    if isinstance(given, dict) and given:
        return given
    return truth if isinstance(truth, dict) else {"answer": truth}


def _item(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any,
          tokenizer: str | None = None) -> dict[str, Any]:
    truth = jsonable(ground_truth)
    extra = jsonable(extra_info) if extra_info is not None else {}
    extra = extra if isinstance(extra, dict) else {"extra_info": extra}
    item: dict[str, Any] = {"prompt": _prompt(extra), "completion": str(solution_str),
                            "dataset": str(data_source or "default"),
                            "reference": _reference(truth, extra), "metadata": extra}
    if (tools := tools_of(extra.get("tools"))) is not None:  # the prompt's tool definitions (rule.tool_calls)
        item["tools"] = tools
    given = extra.get("num_tokens")
    if isinstance(given, int) and not isinstance(given, bool):
        item["num_tokens"] = given
    elif (tok := _tokenizer(tokenizer)) is not None:
        item["num_tokens"] = len(tok(str(solution_str), add_special_tokens=False)["input_ids"])
    return item


def _as_dict(result: dict[str, Any], on_error: str | float) -> dict[str, Any]:
    out: dict[str, Any] = {"score": result["total"]}
    errors = {n: c["error"] for n, c in result["rewards"].items() if c["error"] is not None}
    if result["total"] is None:
        if on_error == "raise":
            raise ScoringError(f"could not score: {errors}")
        out["score"] = float(on_error)
    for name, comp in result["rewards"].items():
        out[name] = comp["value"] if comp["value"] is not None else float(on_error)
    if on_error != "raise":
        out["reward_error"] = float(bool(errors))
    return out


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                  spec: str | None = None, url: str | None = None, api_key: str | None = None,
                  on_error: str | float = "raise", tokenizer: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """verl's reward-function signature: one response -> ``{"score", <component>...}`` (one request)."""
    item = _item(data_source, solution_str, ground_truth, extra_info, tokenizer)
    [result] = _client(url, spec, api_key).score([item])
    return _as_dict(result, on_error)


def compute_score_batch(data_sources: list[Any], solution_strs: list[str], ground_truths: list[Any],
                        extra_infos: list[Any] | None = None, *, spec: str | None = None, url: str | None = None,
                        api_key: str | None = None, on_error: str | float = "raise", tokenizer: str | None = None,
                        **kwargs: Any) -> list[dict[str, Any]]:
    """verl's legacy batch reward manager signature: the whole batch in one request (chunked)."""
    extras = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    items = [_item(*row, tokenizer) for row in zip(data_sources, solution_strs, ground_truths, extras, strict=True)]
    return [_as_dict(r, on_error) for r in _client(url, spec, api_key).score(items)]


class _Sharer:
    """One event loop's calls for one target: a call that finds no request being prepared starts one; every
    call that arrives before it is sent, or while it is in flight, goes in the next request. No timer: a
    lone call is sent at once, and the results are the same however the calls were grouped."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.pending: list[tuple[dict[str, Any], asyncio.Future]] = []
        self.running = False
        self.request_sizes: list[int] = []  # items per request sent (what sharing achieved)

    async def score(self, item: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((item, future))
        if not self.running:
            self.running = True
            loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(0)  # the calls already scheduled in this turn of the loop join the first request
            while self.pending:
                part, self.pending = self.pending, []
                self.request_sizes.append(len(part))
                try:
                    results = await loop.run_in_executor(None, self.client.score, [i for i, _ in part])
                    if len(results) != len(part):
                        raise ScoringError(f"POST /v1/score: {len(results)} results for {len(part)} items")
                except Exception as exc:  # the request failed: every call in it raises the same error
                    for _, f in part:
                        if not f.done():
                            f.set_exception(exc)
                    continue
                for (_, f), r in zip(part, results, strict=True):  # lengths checked above
                    if not f.done():
                        f.set_result(r)
        finally:  # nothing left waiting, whatever went wrong (a cancelled drain included)
            self.running = False
            for _, f in self.pending:
                if not f.done():
                    f.set_exception(ScoringError("the request sharer stopped before scoring this item"))
            self.pending = []


_sharers: dict[tuple[asyncio.AbstractEventLoop, Target], _Sharer] = {}


def sharer(spec: str | None = None, url: str | None = None, api_key: str | None = None) -> _Sharer:
    """The running event loop's request sharer for this target (created on first use)."""
    loop = asyncio.get_running_loop()
    client = _client(url, spec, api_key)
    key = (loop, client.target)
    with _lock:
        if key not in _sharers:
            _sharers[key] = _Sharer(client)
        return _sharers[key]


async def compute_score_async(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                              spec: str | None = None, url: str | None = None, api_key: str | None = None,
                              on_error: str | float = "raise", tokenizer: str | None = None,
                              **kwargs: Any) -> dict[str, Any]:
    """verl 0.9's reward loop: ``compute_score`` as a coroutine, the event loop's calls sharing requests."""
    item = _item(data_source, solution_str, ground_truth, extra_info, tokenizer)
    result = await sharer(spec, url, api_key).score(item)
    return _as_dict(result, on_error)

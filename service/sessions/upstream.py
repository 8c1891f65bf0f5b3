"""Forwarding one call to the session's upstream (vLLM's or SGLang's OpenAI server, or ``grpo-curator infer``).

The call asks for token ids and log-probs the way vLLM gives them (``return_token_ids: true`` ->
``prompt_token_ids`` top level (chat) or per choice (completions) and ``choices[].token_ids``;
``logprobs`` -> ``choices[].logprobs.content[].logprob`` (chat) or ``.token_logprobs`` (completions)).
SGLang answers ``return_token_ids`` with both lists per choice (``choices[].prompt_token_ids`` and
``.token_ids``, chat and completions). SGLang releases whose chat route predates ``return_token_ids``
give them only through ``return_prompt_token_ids`` (per-choice ``prompt_token_ids``) and
``return_meta_info`` (per-choice ``meta_info.output_token_logprobs``: ``[logprob, token_id, text]`` per
completion token); ``meta_info=True`` (``GRPO_CURATOR_INFERENCE_SGLANG_META_INFO``) asks for those too.
A refused connection, a timeout, a 429 or a 5xx is retried with exponential backoff inside the call's
deadline; the agent gets the answer without the fields it did not ask for. The call names no ``model``
(``sampling.sent``): each of these answers it with the model it serves, never a LoRA adapter;
``served_models`` reads the names an agent's ``model`` may give.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import orjson

from service.ingest.schemas import LOGPROB_FLOOR, LOGPROB_SLACK, logprob_problem

RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
JSON_HEADERS = {"content-type": "application/json"}


@dataclass
class Forwarded:
    status: int  # the upstream's status (502 / 504 when it never answered)
    payload: Any  # the upstream's JSON answer (or an error object)
    policy_version: int | None  # the upstream's x-policy-version header, when it sent one
    attempts: int
    latency_ms: float
    error: str | None  # the upstream's failure (after retries), None when it answered 2xx or 4xx


def upstream_urls(setting: str) -> list[str]:
    return [u.strip().rstrip("/") for u in setting.split(",") if u.strip()]


def sticky(urls: list[str], session_id: str) -> str:
    """The same upstream for every call of a session (its prefix cache holds the history)."""
    return urls[int(hashlib.sha256(session_id.encode()).hexdigest(), 16) % len(urls)]


def served_models(client: httpx.Client, url: str, timeout_s: float) -> frozenset[str] | None:
    """The names the upstream serves its own model under: ``GET {url}/models``'s entries without a ``parent``
    (vLLM and SGLang list a LoRA adapter with its base model as ``parent``). None when it does not say
    (unreachable, no such route, not an OpenAI model list)."""
    try:
        payload = _json(client.get(url + "/models", timeout=timeout_s))
    except httpx.HTTPError:
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    names = frozenset(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
                      and not m.get("parent")) if isinstance(data, list) else frozenset()
    return names or None


def upstream_body(kind: str, body: dict[str, Any], meta_info: bool = False) -> dict[str, Any]:
    out = dict(body, return_token_ids=True)
    if meta_info:  # SGLang's older spelling (its chat route without return_token_ids)
        out.update(return_prompt_token_ids=True, return_meta_info=True)
    if kind == "chat":
        out["logprobs"] = True
    elif not isinstance(body.get("logprobs"), int) or isinstance(body.get("logprobs"), bool):
        out["logprobs"] = 0  # the sampled token's log-prob only
    return out


def forward(client: httpx.Client, url: str, kind: str, body: dict[str, Any], deadline_s: float,
            retry_base_s: float, meta_info: bool = False) -> Forwarded:
    path = "/chat/completions" if kind == "chat" else "/completions"
    content = orjson.dumps(upstream_body(kind, body, meta_info))  # once for every attempt (an agent's history is long)
    start = time.monotonic()
    end, attempt, error = start + deadline_s, 0, "no attempt"
    while True:
        attempt += 1
        left = end - time.monotonic()
        try:
            r = client.post(url + path, content=content, headers=JSON_HEADERS, timeout=max(left, 0.01))
            if r.status_code not in RETRIED_STATUS:
                payload = _json(r)
                ms = (time.monotonic() - start) * 1000
                return Forwarded(r.status_code, payload, _version(r), attempt, ms, None)
            error = f"upstream answered {r.status_code}: {r.text[:200]}"
        except httpx.TimeoutException:
            error = f"upstream timed out after {deadline_s:g} s"
        except httpx.HTTPError as exc:
            error = f"upstream unreachable: {exc.__class__.__name__}: {str(exc)[:200]}"
        pause = retry_base_s * 2 ** (attempt - 1)
        if time.monotonic() + pause >= end:
            ms = (time.monotonic() - start) * 1000
            return Forwarded(502, {"error": {"message": error}}, None, attempt, ms, error)
        time.sleep(pause)


def _json(r: httpx.Response) -> Any:
    try:
        return orjson.loads(r.content)  # an answer holds its whole prompt's ids: long, parsed ~4x faster
    except orjson.JSONDecodeError:
        pass
    try:
        return r.json()  # what orjson refuses and Python's parser reads: NaN (a broken server's), ints past 64 bits
    except ValueError:
        return {"error": {"message": r.text[:500]}}


def _version(r: httpx.Response) -> int | None:
    raw = r.headers.get("x-policy-version")
    try:
        version = int(raw) if raw is not None else None
    except ValueError:
        return None
    return version if version is not None and 0 <= version < MAX_TOKEN_ID else None  # an int4, never negative


@dataclass(frozen=True)
class Tokens:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    message: dict[str, Any]  # the assistant message (chat) or {"content": text} (completions)


MAX_TOKEN_ID = 2**31  # token ids are stored as int32 (service.store.arrays.TOKEN_DTYPE)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int for v in value)  # a JSON int: never a bool


def _floats(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is float or type(v) is int for v in value)


def _check_ids(name: str, ids: list[int]) -> None:
    if not ids or (min(ids) >= 0 and max(ids) < MAX_TOKEN_ID):  # (C speed: a prompt is thousands of ids)
        return
    bad = next(i for i, v in enumerate(ids) if not 0 <= v < MAX_TOKEN_ID)
    raise ValueError(f"{name}[{bad}]: token id {ids[bad]} outside 0 to 2^31 - 1")


def _check_logprobs(logprobs: list[float]) -> None:
    """Ingest's one rule for behaviour log-probs, checked when the call is answered (not first at finish)."""
    with contextlib.suppress(OverflowError):  # (an integer past a float's range: the loop names it)
        values = np.asarray(logprobs, dtype=np.float64)
        if ((values >= LOGPROB_FLOOR) & (values <= LOGPROB_SLACK)).all():  # logprob_problem's bounds, at C speed
            return
    for i, v in enumerate(logprobs):
        if (problem := logprob_problem(v)) is not None:
            raise ValueError(f"choices[0].logprobs[{i}]: {problem}")


def extract(kind: str, payload: Any) -> Tokens:
    """The token ids and log-probs of an answer; ValueError naming what is missing or inconsistent."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError("choices: expected exactly one choice")
    choice = choices[0]
    prompt = payload.get("prompt_token_ids")  # vLLM's chat: top level; vLLM's completions, SGLang: per choice
    prompt = prompt if prompt is not None else choice.get("prompt_token_ids")
    completion, logprobs = choice.get("token_ids"), None
    if completion is None:  # SGLang without return_token_ids: meta_info.output_token_logprobs
        completion, logprobs = _meta_info(choice.get("meta_info"))
    if not _ints(prompt) or not _ints(completion):
        raise ValueError("prompt_token_ids / choices[0].token_ids: missing (does the upstream support "
                         "return_token_ids? vLLM >= 0.10.2, SGLang, or grpo-curator infer; an SGLang without "
                         "it on chat needs GRPO_CURATOR_INFERENCE_SGLANG_META_INFO=true)")
    if logprobs is None:
        lp = choice.get("logprobs") or {}
        logprobs = ([c.get("logprob") for c in lp.get("content") or [] if isinstance(c, dict)]
                    if kind == "chat" else lp.get("token_logprobs"))
    if not _floats(logprobs) or len(logprobs) != len(completion):
        raise ValueError("choices[0].logprobs: missing or not one per completion token")
    _check_ids("prompt_token_ids", prompt)
    _check_ids("choices[0].token_ids", completion)
    _check_logprobs(logprobs)
    message = choice.get("message") if kind == "chat" else {"content": choice.get("text")}
    return Tokens(prompt, completion, [float(x) for x in logprobs], choice.get("finish_reason"),
                  message if isinstance(message, dict) else {})


def _meta_info(meta: Any) -> tuple[Any, Any]:
    """(completion ids, log-probs) from SGLang's ``meta_info.output_token_logprobs``; (None, None) without it."""
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, list | tuple) and len(e) >= 2 for e in entries):
        return None, None
    return [e[1] for e in entries], [e[0] for e in entries]


def for_agent(kind: str, asked: dict[str, Any], payload: Any) -> Any:
    """The answer without the fields the agent did not ask for."""
    if not isinstance(payload, dict):
        return payload
    out = dict(payload)
    lp = asked.get("logprobs")
    keep_ids, keep_lp = bool(asked.get("return_token_ids")), lp is not None and lp is not False
    keep_prompt_ids, keep_meta = keep_ids or bool(asked.get("return_prompt_token_ids")), bool(asked.get("return_meta_info"))
    if not keep_ids:
        out.pop("prompt_token_ids", None)
    choices = []
    for choice in out.get("choices") or []:
        c = dict(choice) if isinstance(choice, dict) else choice
        if isinstance(c, dict):
            if not keep_ids:
                c.pop("token_ids", None)
            if not keep_prompt_ids:
                c.pop("prompt_token_ids", None)
            if not keep_meta:
                c.pop("meta_info", None)
            if not keep_lp:
                c["logprobs"] = None
        choices.append(c)
    if "choices" in out:
        out["choices"] = choices
    return out

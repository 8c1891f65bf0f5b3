"""Forwarding one call to the session's upstream (vLLM's OpenAI server, or ``grpo-curator infer``).

The call asks for token ids and log-probs the way vLLM gives them (``return_token_ids: true`` ->
``prompt_token_ids`` top level (chat) or per choice (completions) and ``choices[].token_ids``;
``logprobs`` -> ``choices[].logprobs.content[].logprob`` (chat) or ``.token_logprobs`` (completions)).
A refused connection, a timeout, a 429 or a 5xx is retried with exponential backoff inside the call's
deadline; the agent gets the answer without the fields it did not ask for.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import httpx

RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})


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


def upstream_body(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body, return_token_ids=True)
    if kind == "chat":
        out["logprobs"] = True
    elif not isinstance(body.get("logprobs"), int) or isinstance(body.get("logprobs"), bool):
        out["logprobs"] = 0  # the sampled token's log-prob only
    return out


def forward(client: httpx.Client, url: str, kind: str, body: dict[str, Any], deadline_s: float,
            retry_base_s: float) -> Forwarded:
    path = "/chat/completions" if kind == "chat" else "/completions"
    start = time.monotonic()
    end, attempt, error = start + deadline_s, 0, "no attempt"
    while True:
        attempt += 1
        left = end - time.monotonic()
        try:
            r = client.post(url + path, json=upstream_body(kind, body), timeout=max(left, 0.01))
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
        return r.json()
    except ValueError:
        return {"error": {"message": r.text[:500]}}


def _version(r: httpx.Response) -> int | None:
    raw = r.headers.get("x-policy-version")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Tokens:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    message: dict[str, Any]  # the assistant message (chat) or {"content": text} (completions)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _floats(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)


def extract(kind: str, payload: Any) -> Tokens:
    """The token ids and log-probs of an answer; ValueError naming what is missing or inconsistent."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError("choices: expected exactly one choice")
    choice = choices[0]
    prompt = payload.get("prompt_token_ids", choice.get("prompt_token_ids"))
    completion = choice.get("token_ids")
    if not _ints(prompt) or not _ints(completion):
        raise ValueError("prompt_token_ids / choices[0].token_ids: missing (does the upstream support "
                         "return_token_ids? vLLM >= 0.10.2 or grpo-curator infer)")
    lp = choice.get("logprobs") or {}
    logprobs = ([c.get("logprob") for c in lp.get("content") or [] if isinstance(c, dict)]
                if kind == "chat" else lp.get("token_logprobs"))
    if not _floats(logprobs) or len(logprobs) != len(completion):
        raise ValueError("choices[0].logprobs: missing or not one per completion token")
    message = choice.get("message") if kind == "chat" else {"content": choice.get("text")}
    return Tokens(prompt, completion, [float(x) for x in logprobs], choice.get("finish_reason"),
                  message if isinstance(message, dict) else {})


def for_agent(kind: str, asked: dict[str, Any], payload: Any) -> Any:
    """The answer without the fields the agent did not ask for."""
    if not isinstance(payload, dict):
        return payload
    out = dict(payload)
    lp = asked.get("logprobs")
    keep_ids, keep_lp = bool(asked.get("return_token_ids")), lp is not None and lp is not False
    if not keep_ids:
        out.pop("prompt_token_ids", None)
    choices = []
    for choice in out.get("choices") or []:
        c = dict(choice) if isinstance(choice, dict) else choice
        if isinstance(c, dict):
            if not keep_ids:
                c.pop("token_ids", None)
                c.pop("prompt_token_ids", None)
            if not keep_lp:
                c["logprobs"] = None
        choices.append(c)
    if "choices" in out:
        out["choices"] = choices
    return out

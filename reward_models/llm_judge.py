"""``judge.llm``: an LLM judge over any OpenAI-compatible ``/chat/completions`` endpoint (vLLM, ...).

A rubric template (``{prompt}``, ``{response}``, ``{reference}``) becomes one user message; the
judge's answer is parsed with ``score_regex`` (default ``Score: N``, last match) and normalised
from [min_score, max_score] to [0, 1]. A spec names an endpoint (``params.endpoint``); its URL, key
environment variable and limits are a ``JudgeEndpoint`` the deployment configures and passes in (a spec
that gives a URL or key variable itself is refused). Concurrency cap, requests-per-minute limit, per-request
timeout, retries with exponential backoff on timeouts / connection errors / 429 / 5xx, and an
in-memory LRU cache keyed by sha256(judge config + messages). Failures and unparseable answers are
errors and are not cached. LLM-as-a-judge: Zheng et al. 2023.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator, model_validator

from reward_models.base import (
    BoundedFloat,
    ComponentError,
    ComponentResult,
    ParamsModel,
    PromptInfo,
    RewardComponent,
    Sample,
    canary_item,
)
from reward_models.patterns import UserPattern
from reward_models.pool import KillablePool, PoolTaskError
from reward_models.text import content_text, render_messages, utf8_safe

# linear in ``re`` (no nested or adjacent overlapping repeats), so it runs inline on any answer
DEFAULT_SCORE_REGEX = r"Score:\s*(-?\d+(?:\.\d+)?)"
SCORE_REGEX_TIMEOUT_S = 2.0
DEFAULT_RUBRIC = (
    "Rate the response to the prompt on a scale of 0 to 10 for correctness and helpfulness.\n\n"
    "Prompt:\n{prompt}\n\nReference answer:\n{reference}\n\nResponse:\n{response}\n\n"
    "Explain briefly, then end with a line 'Score: N'."
)
_PLACEHOLDER = re.compile(r"\{(prompt|response|reference)\}")
_MAX_BACKOFF_S = 30.0
_RAW_CHARS = 2000
JUDGE_ANSWER_UNUSABLE = "judge_answer_unusable"  # the judge answered this item unusably twice; its canary is fine
_CANARY_TTL_S = 60.0


class JudgeEndpoint(ParamsModel):
    """A judge endpoint, configured by the deployment (never by a spec): where requests go, which
    environment variable holds its key, and the limits the service keeps towards it."""

    url: str = Field(pattern=r"^https?://", description="OpenAI-compatible base URL, e.g. http://host:8000/v1")
    api_key_env: str | None = Field(default=None, description="environment variable holding the bearer key")
    max_concurrency: int = Field(default=8, ge=1)
    rpm: float | None = Field(default=None, gt=0.0)
    timeout_s: float = Field(default=60.0, gt=0.0)
    max_retries: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=0.5, ge=0.0)


# what a spec may not say: where requests go and with which credentials or limits (JudgeEndpoint's fields)
DEPLOYMENT_ONLY = ("base_url", "url", "api_key", *JudgeEndpoint.model_fields)


class LLMJudgeParams(ParamsModel):
    endpoint: str = Field(min_length=1, description="the name of a judge endpoint the deployment configured")
    model: str = Field(min_length=1)
    rubric: str = DEFAULT_RUBRIC
    system: str | None = None
    score_regex: str = DEFAULT_SCORE_REGEX
    min_score: BoundedFloat = 0.0
    max_score: BoundedFloat = 10.0
    temperature: float = Field(default=0.0, ge=0.0)
    max_tokens: int = Field(default=512, ge=1)
    cache_size: int = Field(default=10_000, ge=0)
    response: Literal["final_answer", "transcript"] = "final_answer"

    @model_validator(mode="before")
    @classmethod
    def _deployment_only(cls, data: object) -> object:
        bad = [k for k in DEPLOYMENT_ONLY if isinstance(data, dict) and k in data]
        if bad:
            raise ValueError(
                f"{bad[0]}: judge URLs, keys and limits are deployment settings, not spec params; "
                "name a configured endpoint with 'endpoint'"
            )
        return data

    @field_validator("rubric")
    @classmethod
    def _rubric(cls, rubric: str) -> str:
        if "{response}" not in rubric:
            raise ValueError("the rubric must contain {response}")
        return rubric

    @field_validator("score_regex")
    @classmethod
    def _regex(cls, pattern: str) -> str:
        try:
            groups = re.compile(pattern).groups
        except re.error as exc:
            raise ValueError(f"invalid regex: {exc}") from None
        if groups < 1:
            raise ValueError("needs a capture group for the score")
        return pattern

    @model_validator(mode="after")
    def _range(self) -> LLMJudgeParams:
        if not self.max_score > self.min_score:
            raise ValueError("max_score must be > min_score")
        return self


def fill_rubric(rubric: str, values: dict[str, str]) -> str:
    """Substitute ``{prompt}``, ``{response}``, ``{reference}`` in one pass (other braces stay)."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], rubric)


def parse_score(text: str, regex: UserPattern) -> float | None:
    """The score in the judge's answer: group 1 of the last match, or None."""
    last = None
    for last in regex.finditer(text):  # noqa: B007 - only the last match counts
        pass
    if last is None:
        return None
    try:
        return float(last.group(1))
    except (TypeError, ValueError):
        return None


def parse_score_in_worker(pattern: str, text: str) -> float | None:
    """Pool task: ``parse_score`` with a spec's own ``score_regex`` (a killable process, a deadline)."""
    return parse_score(text, UserPattern(pattern, dotall=False))


_regex_pool: KillablePool | None = None
_regex_pool_lock = threading.Lock()


def _pool() -> KillablePool:
    """One small killable pool per process for spec regexes on judge answers, closed at exit."""
    global _regex_pool
    with _regex_pool_lock:
        if _regex_pool is None:
            _regex_pool = KillablePool(1, memory_mb=512, preload=("reward_models.llm_judge",))
            atexit.register(_regex_pool.close)
        return _regex_pool


def _reference_text(reference: dict) -> str:
    answer = reference.get("answer")
    if answer is not None:
        return str(answer)
    return json.dumps({k: v for k, v in reference.items() if k != "tests"}, sort_keys=True)


def _prompt_text(messages: list[dict]) -> str:
    return content_text(messages[0]) if len(messages) == 1 else render_messages(messages)


class LLMJudge(RewardComponent):
    """Normalised judge score in [0, 1] for one trajectory."""

    kind = "judge.llm"
    Params = LLMJudgeParams

    def __init__(self, params: dict | None = None, endpoints: Mapping[str, JudgeEndpoint] | None = None) -> None:
        super().__init__(params)
        p = self.params
        self._regex = UserPattern(p.score_regex, dotall=False)
        # None when the deployment has no such endpoint: every score is then an error naming it
        self.endpoint: JudgeEndpoint | None = (endpoints or {}).get(p.endpoint)
        self._known = sorted(endpoints or {})
        ep = self.endpoint
        self._url = "" if ep is None else ep.url.rstrip("/") + "/chat/completions"
        self._slots = threading.BoundedSemaphore(1 if ep is None else ep.max_concurrency)
        self._lock = threading.Lock()
        self._next_request = 0.0
        self._cache: OrderedDict[str, tuple[float, dict]] = OrderedDict()
        self._canary_checked: tuple[float, bool] | None = None  # (when, healthy)
        self._client: httpx.Client | None = None

    def judge_messages(self, sample: Sample, prompt: PromptInfo) -> list[dict]:
        """The chat messages sent to the judge for one sample."""
        p = self.params
        response = sample.final_answer if p.response == "final_answer" else render_messages(sample.messages)
        values = {
            "prompt": _prompt_text(prompt.messages),
            "response": response,
            "reference": _reference_text(prompt.reference),
        }
        messages = [{"role": "system", "content": p.system}] if p.system else []
        # the request body is UTF-8: a lone surrogate the model wrote becomes U+FFFD, not an error
        return [*messages, {"role": "user", "content": utf8_safe(fill_rubric(p.rubric, values))}]

    def _ep(self) -> JudgeEndpoint:
        if self.endpoint is None:
            known = ", ".join(self._known) or "none configured"
            raise ComponentError(f"unknown judge endpoint {self.params.endpoint!r}; configured: {known}")
        return self.endpoint

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        self._ep()
        messages = self.judge_messages(sample, prompt)
        key = self._cache_key(messages)
        cached = self._cache_get(key)
        if cached is not None:
            return cached[0], {**cached[1], "cached": True}
        score, details, problem = self._ask(messages)
        if problem is not None:  # once more: a judge's slip rarely repeats, an answer that steers it does
            score, details, problem = self._ask(messages)
        if problem is not None:
            if not self._canary_healthy():
                raise ComponentError(problem, details)
            # the judge scores its canary as asked, and this item's text made it answer unusably twice
            # (prompt injection, a text that derails it): the model's doing, a 0 -- never a null to seek
            return 0.0, {**details, "reason": JUDGE_ANSWER_UNUSABLE, "judge_error": problem, "cached": False}
        p = self.params
        value = (score - p.min_score) / (p.max_score - p.min_score)  # type: ignore[operator]
        details["judge_score"] = score
        self._cache_put(key, value, details)
        return value, {**details, "cached": False}

    def _ask(self, messages: list[dict]) -> tuple[float | None, dict, str | None]:
        """One judge answer -> (score, details, None) or (None, details, why it cannot be used)."""
        content, attempts = self._complete(messages)
        details = {"raw": content[:_RAW_CHARS], "attempts": attempts}
        score = self._parse(content, details)
        p = self.params
        if score is None:
            return None, details, "unparseable judge answer"
        if not p.min_score <= score <= p.max_score:
            return None, details, f"judge score {score} outside [{p.min_score}, {p.max_score}]"
        return score, details, None

    def _canary_healthy(self) -> bool:
        """Does the judge answer a plain item usably now? (cached for a minute; errors mean no)"""
        now = time.monotonic()
        with self._lock:
            if self._canary_checked is not None and now - self._canary_checked[0] < _CANARY_TTL_S:
                return self._canary_checked[1]
        sample, prompt = canary_item("4", {"answer": "4"})
        prompt = dataclasses.replace(prompt, messages=[{"role": "user", "content": "What is 2 + 2?"}])
        try:
            healthy = self._ask(self.judge_messages(sample, prompt))[2] is None
        except ComponentError:
            healthy = False
        with self._lock:
            self._canary_checked = (now, healthy)
        return healthy

    def _parse(self, content: str, details: dict) -> float | None:
        """The score in the judge's answer (untrusted text: it may echo the policy). The built-in
        ``score_regex`` and a spec's regex RE2 can run within the inline bound run here; any other
        spec regex runs in a killable process under ``SCORE_REGEX_TIMEOUT_S`` (an error if it passes)."""
        if self.params.score_regex == DEFAULT_SCORE_REGEX or self._regex.inline_ok(content):
            return parse_score(content, self._regex)
        future = _pool().submit(parse_score_in_worker, self.params.score_regex, content, timeout_s=SCORE_REGEX_TIMEOUT_S)
        try:
            return future.result()
        except PoolTaskError as exc:
            raise ComponentError(f"score_regex on the judge's answer: {exc}", details) from None

    def score_batch(self, items: list[tuple[Sample, PromptInfo]]) -> list[ComponentResult]:
        """Judge items concurrently (at most ``max_concurrency`` requests in flight)."""
        if len(items) <= 1 or self.endpoint is None:
            return [self.score(s, p) for s, p in items]
        return _map_on_daemons(lambda item: self.score(*item), items, min(self.endpoint.max_concurrency, len(items)))

    def _cache_key(self, messages: list[dict]) -> str:
        config = self.params.model_dump(
            include={
                "endpoint",
                "model",
                "rubric",
                "system",
                "score_regex",
                "min_score",
                "max_score",
                "temperature",
                "max_tokens",
            }
        )
        blob = json.dumps({"config": config, "url": self._url, "messages": messages}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _cache_get(self, key: str) -> tuple[float, dict] | None:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        return None

    def _cache_put(self, key: str, value: float, details: dict) -> None:
        if self.params.cache_size == 0:
            return
        with self._lock:
            self._cache[key] = (value, details)
            while len(self._cache) > self.params.cache_size:
                self._cache.popitem(last=False)

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                limits = httpx.Limits(max_connections=self._ep().max_concurrency)
                self._client = httpx.Client(timeout=self._ep().timeout_s, limits=limits)
            return self._client

    def _wait_for_rate_limit(self) -> None:
        """Space requests ``60 / rpm`` seconds apart (shared by all threads of this judge)."""
        rpm = self._ep().rpm
        if rpm is None:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_request)
            self._next_request = start + 60.0 / rpm
        time.sleep(start - now)

    def _headers(self) -> dict[str, str]:
        env = self._ep().api_key_env
        if env is None:
            return {}
        if not os.environ.get(env):
            raise ComponentError(f"environment variable {env} is not set")
        return {"Authorization": f"Bearer {os.environ[env]}"}

    def _complete(self, messages: list[dict]) -> tuple[str, int]:
        """POST with retries; returns (answer text, attempts). Retries timeouts, connection errors,
        429 and 5xx with backoff ``backoff_s * 2**k`` (or Retry-After); other 4xx fail at once."""
        p, ep = self.params, self._ep()
        body = {
            "model": p.model,
            "messages": messages,
            "temperature": p.temperature,
            "max_tokens": p.max_tokens,
        }
        headers, last_error, delay = self._headers(), "", 0.0
        for attempt in range(1, ep.max_retries + 2):
            time.sleep(delay)
            self._wait_for_rate_limit()
            response, last_error = self._post(body, headers)
            if response is not None and response.status_code < 400:
                return _answer_text(response), attempt
            if response is not None and response.status_code != 429 and response.status_code < 500:
                raise ComponentError(f"judge HTTP {response.status_code}: {response.text[:300]}")
            delay = min(ep.backoff_s * 2 ** (attempt - 1), _MAX_BACKOFF_S)
            if response is not None:
                delay = max(delay, _retry_after(response))
        raise ComponentError(f"judge failed after {ep.max_retries + 1} attempts: {last_error}")

    def _post(self, body: dict, headers: dict[str, str]) -> tuple[httpx.Response | None, str]:
        with self._slots:
            try:
                response = self._http().post(self._url, json=body, headers=headers)
            except httpx.TimeoutException:
                return None, f"timeout after {self._ep().timeout_s:g}s"
            except httpx.TransportError as exc:
                return None, f"judge unreachable: {type(exc).__name__}: {exc}"
        return response, f"HTTP {response.status_code}"


def _answer_text(response: httpx.Response) -> str:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ComponentError(f"malformed judge response: {response.text[:300]}") from None
    if not isinstance(content, str):
        raise ComponentError("malformed judge response: message content is not text")
    return content


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", 0.0)), _MAX_BACKOFF_S)
    except ValueError:
        return 0.0


def _map_on_daemons(fn: Callable[[Any], ComponentResult], items: list, workers: int) -> list[ComponentResult]:
    """``[fn(item) for item in items]`` on ``workers`` daemon threads: a process shutting down never waits
    for a judge that does not answer (``ThreadPoolExecutor``'s threads are joined at interpreter exit).
    ``fn`` (``score``) turns every failure into an error result, so it never raises."""
    results: list[Any] = [None] * len(items)
    pending = iter(enumerate(items))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                nxt = next(pending, None)
            if nxt is None:
                return
            results[nxt[0]] = fn(nxt[1])

    threads = [threading.Thread(target=work, daemon=True, name="judge") for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results

"""An OpenAI-compatible inference server over transformers, for CPU, tests and the demo.

``POST /v1/chat/completions`` and ``POST /v1/completions`` answer the way vLLM's OpenAI server does for
the fields RL needs: ``return_token_ids: true`` adds the prompt's token ids (top level for chat, per
choice for completions, as vLLM places them) and each choice's ``token_ids``; ``logprobs: true`` (chat)
adds ``choices[].logprobs.content[].logprob``, ``logprobs: N`` (completions) the legacy
``choices[].logprobs.token_logprobs``. The log-probs are those of the sampling distribution (logits /
temperature, no top-k / top-p unless asked), the behaviour log-probs a trainer's importance weights need.
A completions ``prompt`` may be text or a list of token ids. ``allowed_token_ids`` (a vLLM extra)
restricts sampling to a set of tokens. Streaming and ``n > 1`` are refused (400).

The model is any local Hugging Face directory (``--model DIR``) or the tiny random model of
``trainer.worker.tiny_model_config`` (``--tiny``). A directory without tokenizer files, and the tiny
model, use ``AsciiTokenizer`` (one token per ASCII character) with a ChatML-like template; assistant tool calls
are written ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and parsed back out of a
completion into ``message.tool_calls`` (the Hermes convention vLLM's tool parsers read).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

PAD, BOS, EOS = 0, 1, 2  # EOS ends a turn (the template's end-of-message token)
_SPECIALS = 3
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class AsciiTokenizer:
    """PAD / BOS / EOS, then one token per character of tab, newline and printable ASCII (``vocab_size``
    100); no download needed. Any other character encodes as ``?``. Special tokens decode to their text
    (``<pad>``, ``<s>``, ``<|im_end|>``) and that text encodes back to them, as a real tokenizer's
    special tokens do: a completion's text round-trips to its exact ids."""

    pad_token_id, bos_token_id, eos_token_id = PAD, BOS, EOS
    alphabet = "\t\n" + "".join(chr(c) for c in range(32, 127))
    vocab_size = _SPECIALS + len(alphabet)
    _special_text = {PAD: "<pad>", BOS: "<s>", EOS: "<|im_end|>"}
    _special_re = re.compile("(" + "|".join(re.escape(t) for t in _special_text.values()) + ")")

    def encode(self, text: str) -> list[int]:
        specials = {t: i for i, t in self._special_text.items()}
        ids: list[int] = []
        for part in self._special_re.split(text):
            if part in specials:
                ids.append(specials[part])
            else:
                ids += [_SPECIALS + self.alphabet.index(c if c in self.alphabet else "?") for c in part]
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.token_text(i) for i in ids)

    def token_text(self, token: int) -> str:
        if token in self._special_text:
            return self._special_text[token]
        return self.alphabet[token - _SPECIALS] if 0 <= token - _SPECIALS < len(self.alphabet) else "?"

    def render(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        """BOS, a tools preamble when ``tools``, then ``<|im_start|>role\\n`` + body + EOS + ``\\n`` per
        message, then the generation prompt ``<|im_start|>assistant\\n``."""
        ids = [BOS]
        if tools:
            ids += self.encode("<|im_start|>system\n# Tools\n" + json.dumps(tools, sort_keys=True)) + [EOS]
            ids += self.encode("\n")
        for m in messages:
            ids += self.encode(f"<|im_start|>{m.get('role', 'user')}\n" + _body(m)) + [EOS] + self.encode("\n")
        return ids + self.encode("<|im_start|>assistant\n")


def _body(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts: the text parts in order
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = message.get("tool_calls") or []
    for call in calls:
        fn = call.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = fn.get("arguments")
        content += "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": arguments}) + "</tool_call>"
    return str(content)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Completion text -> (content without the calls, OpenAI ``tool_calls``). A block that is not a JSON
    object with a string ``name`` stays in the content (it is not a call a parser recognises); arguments
    that are not an object are passed on as their text, for the caller to judge."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            body = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return match.group(0)
        args = body.get("arguments", {})
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": body["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
        })
        return ""

    content = TOOL_CALL.sub(take, text)
    return content, calls


@dataclass
class Generated:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # stop | length


class BadRequest(ValueError):
    """A request field the server cannot honour (400 naming it)."""


class Engine:
    """One model, one request at a time (CPU serving for tests and demos)."""

    def __init__(self, model: Any, tokenizer: Any, name: str, policy_version: int | None = None) -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.policy_version = policy_version
        self.lock = threading.Lock()

    def render(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        if isinstance(self.tokenizer, AsciiTokenizer):
            return self.tokenizer.render(messages, tools)
        from rollout.tasks import chat_template_ids

        return chat_template_ids(self.tokenizer, messages, tools)

    def encode(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.model.config.vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise BadRequest(f"prompt: token ids must be in [0, {vocab})")
            return list(prompt)
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
            return [BOS] + ids if isinstance(self.tokenizer, AsciiTokenizer) else list(ids)
        raise BadRequest("prompt: a string or a non-empty list of token ids")

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generated:
        eos = self.tokenizer.eos_token_id
        inputs = torch.tensor([prompt_ids])  # (1, P)
        kwargs: dict[str, Any] = {"do_sample": params.temperature > 0, "max_new_tokens": params.max_tokens,
                                  "eos_token_id": eos, "pad_token_id": self.tokenizer.pad_token_id or eos,
                                  "output_scores": True, "return_dict_in_generate": True}
        if params.temperature > 0:
            kwargs.update(temperature=params.temperature, top_k=0, top_p=params.top_p)
        else:
            kwargs.update(temperature=None, top_k=None, top_p=None)
        if params.allowed_token_ids is not None:
            allowed = torch.zeros(self.model.config.vocab_size, dtype=torch.bool)
            allowed[list(params.allowed_token_ids)] = True
            kwargs["logits_processor"] = [_Allowed(allowed)]
        with self.lock:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
        generated = out.sequences[0, inputs.shape[1]:].tolist()  # (T,)
        scores = torch.stack(out.scores, dim=1).float()[0]  # (T, V): processed logits
        logp = torch.log_softmax(scores, dim=-1).gather(-1, torch.tensor(generated).unsqueeze(-1)).squeeze(-1)
        if eos in generated:
            end = generated.index(eos) + 1
            return Generated(generated[:end], logp[:end].tolist(), "stop")
        return Generated(generated, logp.tolist(), "length")


class _Allowed:
    """A logits processor: every token outside ``allowed`` gets -inf."""

    def __init__(self, allowed: torch.Tensor) -> None:
        self.allowed = allowed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(~self.allowed[: scores.shape[-1]], float("-inf"))


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    allowed_token_ids: tuple[int, ...] | None


def _number(body: dict[str, Any], name: str, default: Any, lo: float, hi: float, integer: bool = False) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
        raise BadRequest(f"{name}: {'an integer' if integer else 'a number'} from {lo:g} to {hi:g}")
    return value


def sampling_params(body: dict[str, Any], vocab: int) -> SamplingParams:
    if body.get("stream"):
        raise BadRequest("stream: streaming is not supported by this server; send stream: false")
    if body.get("n", 1) != 1:
        raise BadRequest("n: only n = 1 is supported; send one request per sample")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", 16, 1, 4096, integer=True)
    allowed = body.get("allowed_token_ids")
    if allowed is not None:
        if not isinstance(allowed, list) or not allowed or any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in allowed
        ):
            raise BadRequest(f"allowed_token_ids: a non-empty list of token ids in [0, {vocab})")
        allowed = tuple(allowed)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=float(_number(body, "temperature", 1.0, 0.0, 1e4)),
        top_p=float(_number(body, "top_p", 1.0, 1e-6, 1.0)),
        seed=_number(body, "seed", None, 0, 2**63 - 1, integer=True),
        allowed_token_ids=allowed,
    )


def _usage(prompt: list[int], gen: Generated) -> dict[str, int]:
    return {"prompt_tokens": len(prompt), "completion_tokens": len(gen.tokens),
            "total_tokens": len(prompt) + len(gen.tokens)}


def chat_completion(engine: Engine, body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages: a non-empty list of message objects")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools: a list of tool definitions")
    params = sampling_params(body, engine.model.config.vocab_size)
    prompt = engine.render(messages, tools)
    gen = engine.generate(prompt, params)
    eos = engine.tokenizer.eos_token_id
    text = engine.tokenizer.decode([t for t in gen.tokens if t != eos])
    content, calls = parse_tool_calls(text) if tools else (text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                              "finish_reason": "tool_calls" if calls and gen.finish_reason == "stop" else gen.finish_reason}
    if body.get("logprobs"):
        choice["logprobs"] = {"content": [
            {"token": _token_text(engine, t), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(gen.tokens, gen.logprobs, strict=True)
        ]}
    answer: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                              "created": int(time.time()), "model": engine.name, "choices": [choice],
                              "usage": _usage(prompt, gen)}
    if body.get("return_token_ids"):
        choice["token_ids"] = gen.tokens
        answer["prompt_token_ids"] = prompt
    return answer


def completion(engine: Engine, body: dict[str, Any]) -> dict[str, Any]:
    params = sampling_params(body, engine.model.config.vocab_size)
    prompt = engine.encode(body.get("prompt"))
    gen = engine.generate(prompt, params)
    eos = engine.tokenizer.eos_token_id
    choice: dict[str, Any] = {"index": 0, "text": engine.tokenizer.decode([t for t in gen.tokens if t != eos]),
                              "logprobs": None,
                              "finish_reason": gen.finish_reason}
    if body.get("logprobs") is not None and body.get("logprobs") is not False:
        choice["logprobs"] = {"tokens": [_token_text(engine, t) for t in gen.tokens],
                              "token_logprobs": gen.logprobs, "top_logprobs": None, "text_offset": []}
    if body.get("return_token_ids"):
        choice["prompt_token_ids"], choice["token_ids"] = prompt, gen.tokens
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": engine.name, "choices": [choice], "usage": _usage(prompt, gen)}


def _token_text(engine: Engine, token: int) -> str:
    tok = engine.tokenizer
    return tok.token_text(token) if isinstance(tok, AsciiTokenizer) else tok.decode([token])


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="grpo-curator infer", docs_url=None, redoc_url=None)

    def answer(request_body: Any, fn: Any) -> JSONResponse:
        if not isinstance(request_body, dict):
            return _error("body: a JSON object")
        try:
            payload = fn(engine, request_body)
        except BadRequest as exc:
            return _error(str(exc))
        headers = {} if engine.policy_version is None else {"x-policy-version": str(engine.policy_version)}
        return JSONResponse(payload, headers=headers)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await _json(request)
        return await _run(answer, body, chat_completion)

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await _json(request)
        return await _run(answer, body, completion)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": engine.name, "object": "model", "owned_by": "grpo-curator"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None


async def _run(fn: Any, *args: Any) -> Any:
    import anyio.to_thread

    return await anyio.to_thread.run_sync(fn, *args)


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": status}}, status_code=status)


def tiny_model(seed: int = 0) -> Any:
    """The tiny random Qwen2-style model sized for ``AsciiTokenizer`` (fp32, the same weights per seed)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.worker import tiny_model_config

    params = tiny_model_config(vocab_size=AsciiTokenizer.vocab_size)
    config = AutoConfig.for_model(params.pop("model_type"), **params)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def load_engine(model: str | None, seed: int = 0, policy_version: int | None = None) -> Engine:
    """``model`` a local HF directory (its tokenizer when it has one, else ``AsciiTokenizer``), or None for
    the tiny random model."""
    if model is None:
        return Engine(tiny_model(seed), AsciiTokenizer(), "tiny", policy_version)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    has_tokenizer = any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    tokenizer = AutoTokenizer.from_pretrained(path) if has_tokenizer else AsciiTokenizer()
    return Engine(lm, tokenizer, path.name, policy_version)

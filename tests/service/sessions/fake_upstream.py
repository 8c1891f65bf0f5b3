"""``fake_vllm``: a stand-in for vLLM's OpenAI server (an outside service we cannot run here), speaking its
wire format for the fields the gateway reads: ``return_token_ids`` -> top-level ``prompt_token_ids`` (chat)
or per choice (completions) and ``choices[].token_ids``; ``logprobs`` -> ``choices[].logprobs.content``
(chat) or ``.token_logprobs`` (completions). It answers at once (no model), so a benchmark sees the
gateway's own cost, and it can answer with vLLM's ``finish_reason: "abort"`` (a request the engine gave up
on). Its prompt ids are a prefix-stable rendering of the messages (one id per character, modulo 90).

``fake_sglang`` (``--flavor sglang``): SGLang's OpenAI server instead. ``return_token_ids`` -> both
``choices[].prompt_token_ids`` and ``choices[].token_ids`` (chat and completions, nothing top level);
``return_prompt_token_ids`` -> ``choices[].prompt_token_ids``; ``return_meta_info`` -> ``choices[].meta_info``
with ``output_token_logprobs`` as ``[logprob, token_id, null]`` per completion token when logprobs were
asked; chat logprobs' ``bytes`` are lists of ints, a choice carries ``matched_stop``. ``--flavor
sglang-meta``: an SGLang release whose chat route has no ``return_token_ids`` (it ignores the flag there).

Hostile answers (an upstream that misbehaves), set at run time with ``POST /fake/mode`` (body: the mode):
``ok`` (the default), ``nan`` (NaN log-probs), ``positive`` (log-probs above 0), ``abyss`` (log-probs of
-1e30, below ingest's floor), ``negative-id`` (a
completion id below 0), ``huge-id`` (2^31), ``list`` (a JSON list, no choices), ``bad-tool`` (a call of
``add`` whose arguments are not JSON), ``tools-dict`` (``tool_calls`` an object, not a list), ``slow``
(answers after 1.5 s), ``stall`` (answers after 5 s: past the tests' call deadline of 3 s, GATEWAY_ENV), ``version-7`` (an ``x-policy-version: 7`` header), ``refuse`` (a 400, as vLLM refuses
a prompt past the model's context). A request's max_tokens is
echoed as ``usage.max_tokens_seen``, its sampling parameters as ``usage.sampling_seen``, the names of all
its fields as ``usage.fields_seen`` (what the gateway forwarded). ``POST /fake/say`` (body: the text) makes
the next answer's text that one (a test picks what the model "said"); ``POST /fake/finish`` (body: a
finish_reason) the next answer's ``finish_reason``, ``tool_calls`` with a valid call of ``add`` (chat).
``GET /v1/models`` lists the model as ``fake`` and a LoRA adapter of it, ``fake-lora`` (vLLM's way: the
adapter's ``parent`` is ``fake``).

    python -m tests.service.sessions.fake_upstream --port 8001 [--finish-reason abort] [--flavor sglang]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

COMPLETION_IDS = [40, 41, 42, 2]  # three tokens of text then EOS
COMPLETION_TEXT = "fak"
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
            "logit_bias")  # echoed as usage.sampling_seen: what the gateway sent


def _chars(text: str) -> list[int]:
    return [10 + ord(c) % 90 for c in text]


def render(messages: list[Any]) -> list[int]:
    ids = [1]
    for m in messages:
        m = m if isinstance(m, dict) else {}
        content = m.get("content")
        ids += [3] + _chars(f"{m.get('role', 'user')}:{content if isinstance(content, str) else ''}") + [2]
    return ids + [4]


FLAVORS = ("vllm", "sglang", "sglang-meta")


def _sglang(kind: str, body: dict[str, Any], choice: dict[str, Any], prompt: list[int], lps: list[float],
            flavor: str) -> None:
    """SGLang's spelling of the token fields, on ``choice`` (SGLang puts nothing top level)."""
    ids_asked = bool(body.get("return_token_ids")) and not (flavor == "sglang-meta" and kind == "chat")
    if ids_asked or (kind == "chat" and body.get("return_prompt_token_ids")):
        choice["prompt_token_ids"] = prompt
    if ids_asked:
        choice["token_ids"] = COMPLETION_IDS
    choice["matched_stop"] = COMPLETION_IDS[-1]
    if kind == "chat" and body.get("return_meta_info"):
        meta: dict[str, Any] = {"id": uuid.uuid4().hex, "finish_reason": {"type": choice["finish_reason"]},
                                "prompt_tokens": len(prompt), "completion_tokens": len(COMPLETION_IDS),
                                "cached_tokens": 0, "weight_version": "default"}
        if body.get("logprobs"):
            meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(COMPLETION_IDS, lps, strict=True)]
        choice["meta_info"] = meta
    if kind == "chat" and isinstance(choice.get("logprobs"), dict):
        for c in choice["logprobs"]["content"]:
            c["bytes"] = list(c["token"].encode())


MODES = ("ok", "nan", "positive", "abyss", "negative-id", "huge-id", "list", "bad-tool", "tools-dict", "slow",
         "stall", "version-7", "refuse")
DELAY_S = {"slow": 1.5, "stall": 5.0}  # how long the answer of a mode that answers late takes
REFUSAL = {"object": "error", "message": "This model's maximum context length is 512 tokens.",
           "type": "BadRequestError", "code": 400}


def _hostile(mode: str, out: dict[str, Any]) -> Any:
    choice = out["choices"][0]
    lp = choice.get("logprobs") or {}
    entries = lp.get("content") or []
    if mode in ("nan", "positive", "abyss"):
        value = {"nan": float("nan"), "positive": 5.0, "abyss": -1e30}[mode]
        for c in entries:
            c["logprob"] = value
        if lp.get("token_logprobs"):
            lp["token_logprobs"] = [value] * len(lp["token_logprobs"])
    elif mode in ("negative-id", "huge-id") and "token_ids" in choice:
        choice["token_ids"] = [-5 if mode == "negative-id" else 2**31, *choice["token_ids"][1:]]
    elif mode == "list":
        return [1, 2]
    elif mode == "bad-tool" and "message" in choice:
        choice["message"] = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}
        choice["finish_reason"] = "tool_calls"
    elif mode == "tools-dict" and "message" in choice:
        choice["message"] = {"role": "assistant", "content": None, "tool_calls": {
            "id": "c1", "type": "function", "function": {"name": "nope", "arguments": "{}"}}}
    return out


def _dumps(payload: Any) -> bytes:
    import json

    return json.dumps(payload).encode()  # NaN as NaN (what a broken server sends), unlike orjson's null


ADD_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
MODELS = {"object": "list", "data": [{"id": "fake", "object": "model", "root": "fake", "parent": None},
                                     {"id": "fake-lora", "object": "model", "root": "/adapters/lora", "parent": "fake"}]}


def app(finish_reason: str = "stop", flavor: str = "vllm") -> Starlette:
    mode: dict[str, str] = {"now": "ok"}
    said: list[str] = []  # the next answer's text, once
    ends: list[str] = []  # the next answer's finish_reason, once

    def answer(kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if kind == "chat":
            prompt = render(body.get("messages") or [])
        else:
            raw = body.get("prompt")
            prompt = list(raw) if isinstance(raw, list) else [1] + _chars(str(raw))
        lps = [-0.25] * len(COMPLETION_IDS)
        end = ends.pop() if ends else finish_reason
        choice: dict[str, Any] = {"index": 0, "finish_reason": end, "logprobs": None}
        text = said.pop() if said else COMPLETION_TEXT
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            if end == "tool_calls":  # the model calls a tool (a valid call of ``add``)
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": [ADD_CALL]}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": str(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                                                  for t, lp in zip(COMPLETION_IDS, lps, strict=True)]}
        else:
            choice["text"] = text
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": [str(t) for t in COMPLETION_IDS], "token_logprobs": lps,
                                      "top_logprobs": None, "text_offset": []}
        out: dict[str, Any] = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "chat.completion" if kind == "chat"
                               else "text_completion", "created": int(time.time()), "model": "fake",
                               "choices": [choice], "usage": {"prompt_tokens": len(prompt),
                                                              "completion_tokens": len(COMPLETION_IDS),
                                                              "total_tokens": len(prompt) + len(COMPLETION_IDS),
                                                              "max_tokens_seen": body.get("max_tokens"),
                                                              "sampling_seen": {k: body.get(k) for k in SAMPLING},
                                                              "fields_seen": sorted(body)}}
        if flavor != "vllm":
            _sglang(kind, body, choice, prompt, lps, flavor)
        elif body.get("return_token_ids"):
            choice["token_ids"] = COMPLETION_IDS
            if kind == "chat":
                out["prompt_token_ids"] = prompt
            else:
                choice["prompt_token_ids"] = prompt
        return out

    async def respond(kind: str, request: Request) -> Response:
        if mode["now"] in DELAY_S:
            import asyncio

            await asyncio.sleep(DELAY_S[mode["now"]])
        if mode["now"] == "refuse":
            return Response(orjson.dumps(REFUSAL), status_code=400, media_type="application/json")
        out = _hostile(mode["now"], answer(kind, orjson.loads(await request.body())))
        raw = _dumps(out) if mode["now"] == "nan" else orjson.dumps(out)
        headers = {"x-policy-version": "7"} if mode["now"] == "version-7" else None
        return Response(raw, media_type="application/json", headers=headers)

    async def chat(request: Request) -> Response:
        return await respond("chat", request)

    async def completions(request: Request) -> Response:
        return await respond("completions", request)

    async def set_mode(request: Request) -> Response:
        asked = (await request.body()).decode()
        if asked not in MODES:
            return Response(f"mode: one of {MODES}".encode(), status_code=422)
        mode["now"] = asked
        return Response(b"ok")

    async def say(request: Request) -> Response:
        said[:] = [(await request.body()).decode()]
        return Response(b"ok")

    async def end_next(request: Request) -> Response:
        ends[:] = [(await request.body()).decode()]
        return Response(b"ok")

    async def models(request: Request) -> Response:
        return Response(orjson.dumps(MODELS), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/models", models), Route("/fake/mode", set_mode, methods=["POST"]),
                             Route("/fake/say", say, methods=["POST"]),
                             Route("/fake/finish", end_next, methods=["POST"]), Route("/health", health)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--finish-reason", default="stop")
    parser.add_argument("--flavor", choices=FLAVORS, default="vllm")
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(app(args.finish_reason, args.flavor), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()

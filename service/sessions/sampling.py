"""What an agent's call may ask for and what is forwarded: an allowlist of request fields, sampled at
temperature only.

The trainer recomputes a trajectory's log-probs from the model at the group's temperature and nothing else,
so any request field that changes the distribution sampled from, or what comes back as the model's tokens,
makes the stored trajectory wrong. The check is therefore deny-by-default: each route (``chat``,
``completions``) has its allowlist (``ALLOWED``), every field outside it is a 400 naming the field and why
(guided decoding and structured outputs, beam search, ``prompt_logprobs``, custom logits processors, an
adapter, anything unknown), and an allowed field with a value that is not allowed is a 400 naming it too:
``n`` / ``best_of`` only 1, ``echo`` only false, ``response_format`` only ``{"type": "text"}``,
``tool_choice`` only ``"auto"`` / ``"none"`` (vLLM decodes ``"required"`` and a named function under a
grammar), ``model`` only the upstream's own (``check_model``).

The log-probs vLLM returns (``--logprobs-mode processed_logprobs``) are those of the distribution it sampled
from, after top-k / top-p / min-p truncation, penalties and logit biases; so an agent may send each of
these only at its neutral value, and every call is forwarded with the neutral values and its temperature
written out (1.0 when the agent gave none): an upstream's own defaults (a model's ``generation_config.json``
without ``--generation-config vllm``) never enter. What is forwarded (``sent``) is built from the allowlist
only, without ``model`` (vLLM, SGLang and ``grpo-curator infer`` answer a request without one with the
model they serve, never an adapter), and the stored request is what was sent.
``rollout.sampler.NEUTRAL_VLLM`` does the same for the producer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from service.api.errors import BadRequest

Kind = Literal["chat", "completions"]
Rule = Callable[[Any], str | None]  # what is wrong with a value that is not null; None: it is allowed

DEFAULT_TEMPERATURE = 1.0
# sent with every call; an agent's own value must equal it (``top_k`` 0 also means "off")
NEUTRAL: dict[str, float | int] = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0,
                                   "frequency_penalty": 0.0, "repetition_penalty": 1.0}
_ALSO_NEUTRAL: dict[str, tuple[float | int, ...]] = {"top_k": (0,)}
# restrict or bias the distribution; accepted only absent or empty (never sent)
EMPTY_ONLY = ("logit_bias", "allowed_token_ids", "bad_words", "min_tokens")
_DOCS = 'docs/agents.md, "Streaming, sampling"'


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type(ok: Callable[[Any], bool], what: str) -> Rule:
    return lambda value: None if ok(value) else what


def _only(allowed: Any, why: str) -> Rule:
    """The one allowed value (compared with its type: ``true`` is no 1)."""
    return lambda value: None if type(value) is type(allowed) and value == allowed else why


def _neutral(field: str) -> Rule:
    neutral = NEUTRAL[field]

    def rule(value: Any) -> str | None:
        if _number(value) and value in (neutral, *_ALSO_NEUTRAL.get(field, ())):
            return None
        return (f"the gateway samples at temperature only; send {field} {neutral!r} or leave it out (got "
                f"{value!r}: vLLM's log-probs would include it and the trainer's would not; {_DOCS})")
    return rule


def _empty(value: Any) -> str | None:
    if value in ({}, [], 0) and not isinstance(value, bool):
        return None
    return (f"the gateway samples at temperature only; leave it out (got a value that changes the distribution "
            f"sampled from; {_DOCS})")


def _temperature(value: Any) -> str | None:
    if _number(value) and 1e-4 <= value <= 1e4:
        return None
    return ("a number from 0.0001 to 10000 (a trajectory is trained at the temperature its log-probs were taken "
            "at; greedy decoding has none)")


_bool = _type(lambda v: isinstance(v, bool), "true or false")
_positive = _type(lambda v: _int(v) and v >= 1, "a positive integer")
_count = _type(lambda v: _int(v) and v >= 0, "a non-negative integer")
_string = _type(lambda v: isinstance(v, str), "a string")
_stop = _type(lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
              "a string or a list of strings")
_ids = _type(lambda v: isinstance(v, list) and all(_int(t) for t in v), "a list of token ids")
_MESSAGES = "a list of message objects"
_PROMPT = "one prompt, a string or a list of token ids (a session is one trajectory; a batch of prompts is refused)"


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _one_prompt(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(_int(v) for v in value))


def _tool_choice(value: Any) -> str | None:
    if value in ("auto", "none") and isinstance(value, str):
        return None
    return ('"auto" or "none" (vLLM decodes "required" and a named function under a grammar: a masked '
            "distribution the trainer does not recompute)")


# every field either route accepts, and what each may be (a null is the field left out)
_SHARED: dict[str, Rule] = {
    "model": _string,  # and the upstream's own name: check_model
    "max_tokens": _positive,
    "temperature": _temperature,
    **{field: _neutral(field) for field in NEUTRAL},
    **dict.fromkeys(EMPTY_ONLY, _empty),
    "seed": _type(_int, "an integer"),
    "stop": _stop,
    "stop_token_ids": _ids,
    "user": _string,
    "stream": _only(False, f"the gateway does not stream; send stream: false ({_DOCS})"),
    "stream_options": _only({}, "only with stream: true, and the gateway does not stream"),
    "n": _only(1, "one completion per call (a session is one trajectory)"),
    "best_of": _only(1, "1 only (the best of several samples is not a sample of the policy)"),
    "echo": _only(False, "false only (echo puts the request's text into the answer: text the model did not "
                         "generate)"),
    "response_format": _only({"type": "text"}, '{"type": "text"} only (a JSON schema or json_object constrains '
                                               "decoding: a masked distribution the trainer does not recompute)"),
    "return_token_ids": _bool,  # the gateway asks for the ids and log-probs itself; these say what the agent
    "skip_special_tokens": _bool,  # gets back, or how its text is detokenized (the token ids stay the same)
    "spaces_between_special_tokens": _bool,
    "include_stop_str_in_output": _bool,
}
ALLOWED: dict[Kind, dict[str, Rule]] = {
    "chat": {**_SHARED, "messages": _type(_objects, _MESSAGES), "max_completion_tokens": _positive,
             "tools": _type(_objects, "a list of tool objects"), "tool_choice": _tool_choice,
             "parallel_tool_calls": _bool, "logprobs": _bool, "top_logprobs": _count,
             "return_prompt_token_ids": _bool, "return_meta_info": _bool},  # SGLang's spellings of the ids
    "completions": {**_SHARED, "prompt": _type(_one_prompt, _PROMPT), "logprobs": _count},
}
_REQUIRED: dict[Kind, tuple[str, str]] = {"chat": ("messages", _MESSAGES), "completions": ("prompt", _PROMPT)}
# allowed only at their defaults: never forwarded (model: the upstream's own, see the module docstring)
_NOT_SENT = frozenset({"model", "n", "best_of", "echo", "response_format", "stream", "stream_options", *EMPTY_ONLY})

_DISTRIBUTION = "it changes the distribution sampled from, which the trainer does not recompute"
_REFUSED_WHY: dict[str, str] = {
    **dict.fromkeys(("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                     "guided_whitespace_pattern", "structured_outputs", "structural_tag", "regex", "ebnf",
                     "json_schema"), f"guided decoding / structured outputs: {_DISTRIBUTION}"),
    **dict.fromkeys(("use_beam_search", "length_penalty", "early_stopping"), "beam search is not sampling"),
    **dict.fromkeys(("logits_processors", "vllm_xargs", "custom_params"),
                    f"custom logits processors: {_DISTRIBUTION}"),
    "ignore_eos": "it generates past the end of sequence the policy samples",
    "prompt_logprobs": "the gateway returns the completion's log-probs only",
    **dict.fromkeys(("lora_path", "lora_request"), "it selects an adapter, not the policy"),
    **dict.fromkeys(("functions", "function_call"), "the legacy function fields; send tools and tool_choice"),
}


def _refuse(message: str) -> BadRequest:
    return BadRequest(message, status_code=400)


def _why(kind: Kind, field: str) -> str:
    if field in _REFUSED_WHY:
        return _REFUSED_WHY[field]
    other: Kind = "completions" if kind == "chat" else "chat"
    if field in ALLOWED[other]:
        return f"a field of the {other} route, not of this one"
    return "not on the gateway's allowlist: a field it does not know could change what is sampled or returned"


def check(kind: Kind, body: dict[str, Any]) -> None:
    """A 400 naming the first field of the agent's request that the route does not accept, or whose value is
    not allowed (a null is the field left out), or its missing ``messages`` / ``prompt``."""
    allowed = ALLOWED[kind]
    for field, value in body.items():
        rule = allowed.get(field)
        if rule is None:
            raise _refuse(f"{field}: refused ({_why(kind, field)}; {_DOCS} lists what a call may send)")
        problem = None if value is None else rule(value)
        if problem is not None:
            raise _refuse(f"{field}: {problem}")
    required, what = _REQUIRED[kind]
    if body.get(required) is None:
        raise _refuse(f"{required}: required, {what}")


def check_model(asked: Any, served: frozenset[str] | None) -> None:
    """A 400 unless the agent's ``model`` is absent or a name the upstream serves its own model under
    (``served``: None when the upstream did not say, and then nothing is checked: ``sent`` names no model)."""
    if asked is None or served is None or asked in served:
        return
    raise _refuse(f"model: the session samples the upstream's own model, served as {', '.join(sorted(served))}; "
                  f"got {asked!r} (another model or a LoRA adapter is not the policy the trainer recomputes "
                  "log-probs with)")


def temperature(body: dict[str, Any]) -> float:
    """The temperature a call is sampled at: the agent's, or 1.0 when it gave none."""
    t = body.get("temperature")
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else DEFAULT_TEMPERATURE


def sent(kind: Kind, body: dict[str, Any]) -> dict[str, Any]:
    """The request as forwarded: the agent's allowed fields (those allowed only at their default left out),
    its sampling written out: the temperature and the neutral values."""
    out = {k: v for k, v in body.items() if k in ALLOWED[kind] and k not in _NOT_SENT}
    return {**out, **NEUTRAL, "temperature": temperature(body)}


def recorded(temperature_: float) -> dict[str, Any]:
    """A session group's ``sampling``: what its calls were sent with."""
    return {"temperature": temperature_, **NEUTRAL}

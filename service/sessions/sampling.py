"""What a session's calls are sampled with: temperature only, every other processor neutral.

The log-probs vLLM returns (``--logprobs-mode processed_logprobs``) are those of the distribution it sampled
from, after top-k / top-p / min-p truncation, penalties and logit biases; the trainer recomputes them from
the model at the group's temperature and nothing else. So an agent may send each of these parameters only
at its neutral value (any other is a 400 naming the field), and every call is forwarded with the neutral
values and its temperature written out (1.0 when the agent gave none): an upstream's own defaults (a
model's ``generation_config.json`` without ``--generation-config vllm``) never enter, and the stored
request is what was sent. ``rollout.sampler.NEUTRAL_VLLM`` does the same for the producer.
"""

from __future__ import annotations

from typing import Any

from service.api.errors import BadRequest

DEFAULT_TEMPERATURE = 1.0
# sent with every call; an agent's own value must equal it (``top_k`` 0 also means "off")
NEUTRAL: dict[str, float | int] = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0,
                                   "frequency_penalty": 0.0, "repetition_penalty": 1.0}
_ALSO_NEUTRAL: dict[str, tuple[float | int, ...]] = {"top_k": (0,)}
# restrict or bias the distribution; accepted only absent or empty (never sent)
EMPTY_ONLY = ("logit_bias", "allowed_token_ids", "bad_words", "min_tokens")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check(body: dict[str, Any]) -> None:
    """A 400 naming the first sampling parameter the agent set to a value that is not neutral."""
    for field, neutral in NEUTRAL.items():
        value = body.get(field)
        if value is None or (_number(value) and value in (neutral, *_ALSO_NEUTRAL.get(field, ()))):
            continue
        raise BadRequest(f"{field}: the gateway samples at temperature only; send {field} {neutral!r} or leave it "
                         f"out (got {value!r}: vLLM's log-probs would include it and the trainer's would not; "
                         "docs/agents.md, \"Streaming, sampling\")", status_code=400)
    for field in EMPTY_ONLY:
        value = body.get(field)
        if value not in (None, {}, [], 0) or isinstance(value, bool):
            raise BadRequest(f"{field}: the gateway samples at temperature only; leave {field} out (got a value "
                             "that changes the distribution sampled from; docs/agents.md, \"Streaming, sampling\")",
                             status_code=400)


def temperature(body: dict[str, Any]) -> float:
    """The temperature a call is sampled at: the agent's, or 1.0 when it gave none."""
    t = body.get("temperature")
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else DEFAULT_TEMPERATURE


def sent(body: dict[str, Any]) -> dict[str, Any]:
    """The agent's request with its sampling written out as forwarded: the temperature and the neutral
    values (the fields of ``EMPTY_ONLY`` dropped: an empty one means none)."""
    out = {k: v for k, v in body.items() if k not in EMPTY_ONLY}
    return {**out, **NEUTRAL, "temperature": temperature(body)}


def recorded(temperature_: float) -> dict[str, Any]:
    """A session group's ``sampling``: what its calls were sent with."""
    return {"temperature": temperature_, **NEUTRAL}

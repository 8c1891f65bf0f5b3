"""``judge.reward_model``: a sequence-classification reward model (transformers), batched, CPU or GPU.

The model scores the prompt + response text; the value is its single logit (``num_labels=1``), as in
the Bradley-Terry reward models of InstructGPT (Ouyang et al. 2022). Load from ``model_path``, or
build a random-initialised model from ``config`` (a transformers config dict with ``model_type``,
seeded) for tests. ``tokenizer="bytes"`` uses UTF-8 bytes as ids (256 = pad), built here, so no
tokenizer files are needed. Texts are truncated from the left (the response end is kept), sorted by
length and right-padded per batch. torch / transformers are imported on first use.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Literal

from pydantic import Field, model_validator

from reward_models.base import (
    ComponentError,
    ComponentResult,
    ParamsModel,
    PromptInfo,
    RewardComponent,
    Sample,
    error_result,
)
from reward_models.text import content_text, render_messages, utf8_safe

BYTE_PAD_ID = 256


class RewardModelParams(ParamsModel):
    model_path: str | None = None
    config: dict[str, Any] | None = None
    tokenizer: str | None = None
    batch_size: int = Field(default=8, ge=1)
    device: Literal["cpu", "cuda", "auto"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_length: int = Field(default=1024, ge=8)
    seed: int = 0
    response: Literal["final_answer", "transcript"] = "final_answer"

    @model_validator(mode="after")
    def _source(self) -> RewardModelParams:
        if (self.model_path is None) == (self.config is None):
            raise ValueError("give exactly one of model_path and config")
        if self.config is not None and "model_type" not in self.config:
            raise ValueError("config needs a model_type (e.g. 'llama')")
        return self


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 and ``BYTE_PAD_ID`` for padding; keeps the last ``max_length``."""

    pad_token_id = BYTE_PAD_ID

    def encode(self, text: str, max_length: int) -> list[int]:
        return list(text.encode("utf-8"))[-max_length:]


class _HFTokenizer:
    """A transformers tokenizer truncating from the left; pad falls back to eos."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.inner = AutoTokenizer.from_pretrained(path)
        self.inner.truncation_side = "left"
        if self.inner.pad_token_id is None:
            self.inner.pad_token = self.inner.eos_token
        self.pad_token_id = self.inner.pad_token_id

    def encode(self, text: str, max_length: int) -> list[int]:
        return self.inner(text, truncation=True, max_length=max_length)["input_ids"]


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ComponentError("device 'cuda' requested but CUDA is not available")
    return device


def _build_model(p: RewardModelParams) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if p.config is not None:
        kwargs = {k: v for k, v in p.config.items() if k != "model_type"}
        kwargs.setdefault("pad_token_id", BYTE_PAD_ID if p.tokenizer in (None, "bytes") else None)
        config = AutoConfig.for_model(p.config["model_type"], num_labels=1, **kwargs)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(p.seed)
            return AutoModelForSequenceClassification.from_config(config)
    assert p.model_path is not None  # the params validator guarantees one of config / model_path
    return AutoModelForSequenceClassification.from_pretrained(p.model_path)


class RewardModelJudge(RewardComponent):
    """The reward model's logit for prompt + response."""

    kind = "judge.reward_model"
    Params = RewardModelParams

    def __init__(self, params: dict | None = None) -> None:
        super().__init__(params)
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: ByteTokenizer | _HFTokenizer | None = None
        self.device = "cpu"

    def load(self) -> None:
        """Load tokenizer and model once (thread-safe); ComponentError if they do not fit together."""
        with self._lock:
            if self._model is not None:
                return
            import torch

            p = self.params
            tokenizer_name = p.tokenizer or p.model_path or "bytes"
            tokenizer = ByteTokenizer() if tokenizer_name == "bytes" else _HFTokenizer(tokenizer_name)
            if (
                isinstance(tokenizer, ByteTokenizer)
                and (p.config or {}).get("vocab_size", 1 << 30) <= BYTE_PAD_ID
            ):
                raise ComponentError(f"tokenizer 'bytes' needs vocab_size > {BYTE_PAD_ID}")
            model = _build_model(p)
            if model.config.num_labels != 1:
                raise ComponentError(f"reward model must have num_labels=1, has {model.config.num_labels}")
            if isinstance(tokenizer, ByteTokenizer) and model.config.vocab_size <= BYTE_PAD_ID:
                raise ComponentError(f"tokenizer 'bytes' needs vocab_size > {BYTE_PAD_ID}")
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tokenizer.pad_token_id
            self.device = _resolve_device(p.device)
            dtype = {
                "auto": torch.bfloat16 if self.device == "cuda" else torch.float32,
                "float32": torch.float32,
                "bfloat16": torch.bfloat16,
                "float16": torch.float16,
            }[p.dtype]
            self._model = model.to(device=self.device, dtype=dtype).eval()
            self._tokenizer = tokenizer

    def text(self, sample: Sample, prompt: PromptInfo) -> str:
        """Prompt + response as the model reads it (chat template if the tokenizer has one)."""
        if self.params.response == "final_answer":
            response = [{"role": "assistant", "content": sample.final_answer}]
        else:
            response = sample.messages
        # content as text (a part whose text is not a string is no text), every string UTF-8-encodable:
        # what the model wrote is read, never an error (docs/components.md)
        messages = [_as_text_message(m) for m in [*prompt.messages, *response] if isinstance(m, dict)]
        inner = getattr(self._tokenizer, "inner", None)
        if inner is not None and getattr(inner, "chat_template", None):
            return utf8_safe(inner.apply_chat_template(messages, tokenize=False))
        return utf8_safe(render_messages(messages))

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        result = self.score_batch([(sample, prompt)])[0]
        if result.error is not None:
            raise ComponentError(result.error, result.details)
        assert result.value is not None
        return result.value, result.details

    def score_batch(self, items: list[tuple[Sample, PromptInfo]]) -> list[ComponentResult]:
        """Logits for all items, ``batch_size`` at a time, shortest first; a failed batch -> errors."""
        start = time.perf_counter()
        try:
            self.load()
        except Exception as exc:  # noqa: BLE001 - e.g. a missing model path: every item errors
            return [
                error_result(f"could not load the reward model: {type(exc).__name__}: {exc}") for _ in items
            ]
        assert self._tokenizer is not None
        outcomes: dict[int, tuple[float | None, str | None]] = {}
        ids: dict[int, list[int]] = {}
        for i, (s, p) in enumerate(items):
            try:
                ids[i] = self._tokenizer.encode(self.text(s, p), self.params.max_length)
            except Exception as exc:  # noqa: BLE001 - a fault of ours on one item: it errors, the batch goes on
                outcomes[i] = (None, f"could not tokenize: {type(exc).__name__}: {exc}")
        order = sorted(ids, key=lambda i: len(ids[i]))
        for first in range(0, len(order), self.params.batch_size):
            chunk = order[first : first + self.params.batch_size]
            try:
                logits = self._forward([ids[i] for i in chunk])
                outcomes.update({i: (v, None) for i, v in zip(chunk, logits, strict=True)})
            except Exception as exc:  # noqa: BLE001 - e.g. CUDA OOM: this batch errors, the rest goes on
                outcomes.update({i: (None, f"{type(exc).__name__}: {exc}") for i in chunk})
        latency = (time.perf_counter() - start) * 1000.0 / max(len(items), 1)
        return [_result(outcomes[i], len(ids.get(i, ())), latency) for i in range(len(items))]

    def _forward(self, batch: list[list[int]]) -> list[float]:
        """Right-padded batch (B, T) -> logits (B,)."""
        import torch

        assert self._tokenizer is not None
        width = max(max(len(x) for x in batch), 1)
        pad = self._tokenizer.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in batch], device=self.device)  # (B, T)
        mask = torch.tensor(
            [[1] * len(x) + [0] * (width - len(x)) for x in batch], device=self.device
        )  # (B, T)
        with self._lock, torch.inference_mode():
            logits = self._model(input_ids=input_ids, attention_mask=mask).logits  # (B, 1)
        return logits[:, 0].float().cpu().tolist()


def _as_text_message(message: dict) -> dict:
    """A chat message with its content as text (what a chat template and ``render_messages`` can read)."""
    return {**message, "content": content_text(message)}


def _result(outcome: tuple[float | None, str | None], num_tokens: int, latency_ms: float) -> ComponentResult:
    value, error = outcome
    details = {"num_tokens": num_tokens}
    if error is not None:
        return error_result(error, details, latency_ms)
    return ComponentResult(value=value, details=details, latency_ms=latency_ms)

"""Upstreams for the gateway tests: our own transformers server (``grpo-curator infer``) in a subprocess,
over a tiny random model saved to a directory (so a test can load the very same weights)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ROOT, free_port


class Upstream:
    def __init__(self, url: str, proc: subprocess.Popen) -> None:
        self.url, self.proc = url, proc  # url ends in /v1

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def save_tiny_model(path: Path, seed: int = 0) -> Path:
    from rollout.infer import tiny_model

    tiny_model(seed).save_pretrained(path)
    return path


def start_infer(model_dir: Path | None, policy_version: int | None = None) -> Upstream:
    """``grpo-curator infer`` over ``model_dir`` (served by its folder's name), or None: ``--tiny``, the tiny
    random model built in the subprocess (``rollout.infer.tiny_model(0)``, served as ``tiny``), for a test that
    reads its tokenizer's tokens but never loads its weights (nothing to save first)."""
    port = free_port()
    which = ["--tiny"] if model_dir is None else ["--model", str(model_dir)]
    cmd = [sys.executable, "-m", "service.cli", "infer", *which, "--port", str(port)]
    if policy_version is not None:
        cmd += ["--policy-version", str(policy_version)]
    return _start(cmd, port)


def start_fake_vllm(finish_reason: str = "stop", flavor: str = "vllm") -> Upstream:
    """``tests.service.sessions.fake_upstream`` (vLLM's wire format, no model) in a subprocess; ``flavor``
    "sglang" / "sglang-meta": SGLang's (fake_sglang)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.service.sessions.fake_upstream", "--port", str(port),
           "--finish-reason", finish_reason, "--flavor", flavor]
    return _start(cmd, port)


def _start(cmd: list[str], port: int) -> Upstream:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # a loaded machine loads torch slowly
    with httpx.Client(timeout=1) as http:  # one client for the polls (a client per poll: an SSL context each)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"infer exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if http.get(base + "/health").status_code == 200:
                    return Upstream(base + "/v1", proc)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("infer did not become healthy in 300 s")


def stop(upstream: Upstream) -> None:
    if upstream.proc.poll() is None:
        upstream.proc.terminate()
        try:
            upstream.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            upstream.kill()


# EOS and the letters a-e (rollout.infer.AsciiTokenizer ids): a restricted sampling set
LETTERS_AND_EOS = [2] + [3 + 2 + (ord(c) - 32) for c in "abcde"]


def recompute_logprobs(model_dir: Path, token_ids: list[int], temperature: float = 1.0) -> list[float]:
    """The trainer's own log-probs (trainer.policy.PolicyLogprobs) of token_ids[1:] given the prefix."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.policy import PolicyLogprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy = PolicyLogprobs(model, temperature=temperature).eval()
    ids = torch.tensor([token_ids])  # (1, L)
    targets = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # (1, L): position t predicts token t+1
    positions = torch.arange(ids.shape[1]).unsqueeze(0)  # (1, L)
    with torch.no_grad():
        logp, _ = policy(ids, positions, None, targets)  # (1, L)
    return logp[0, :-1].tolist()  # (L-1,): log-prob of token_ids[t+1]


def save_scripted_model(path: Path, script: list[tuple[list[int], str]], seed: int = 0, max_steps: int = 400) -> Path:
    """A tiny real model trained (on CPU, seconds) until greedy decoding of each prompt (token ids) yields
    its completion text then EOS: a deterministic agent policy for tests that need a given tool call."""
    import torch

    from rollout.infer import EOS, AsciiTokenizer, tiny_model

    tok = AsciiTokenizer()
    model = tiny_model(seed).train()
    rows = [prompt + tok.encode(text) + [EOS] for prompt, text in script]
    # one right-padded batch (a step in one forward, not one per row): causal attention keeps the pads
    # after a row's tokens out of them, and the pads are not learned
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)  # (B, L)
    labels = torch.full_like(ids, -100)  # (B, L): only the completions are learned
    for i, ((prompt, _), row) in enumerate(zip(script, rows, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, len(prompt) : len(row)] = torch.tensor(row[len(prompt) :])
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(max_steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.02:
            break
    model.eval()
    with torch.no_grad():
        for prompt, text in script:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=len(text) + 2, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=0)
            got = tok.decode(out[0, len(prompt):].tolist())
            assert got == text + "<|im_end|>", f"the scripted model did not learn {text!r}: {got!r}"
    model.save_pretrained(path)
    return path

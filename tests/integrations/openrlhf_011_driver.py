"""Runs OpenRLHF 0.11's own reward path in a process of its own, with the 0.11 copy first on ``sys.path``
(0.8 is the one installed in the venv). Run as ``python openrlhf_011_driver.py URL_OR_FILE JSON_CASES``:
for each case ``{"response": ..., "label": ...}`` OpenRLHF's ``SingleTurnAgentExecutor.execute`` generates
(a fake engine that answers the response) and fetches the reward, its ``_process_response_into_experience``
turns the output into an ``Experience``, and ``Experience.concat_experiences`` joins them, as its samples
generator does. Prints one JSON line: per case the executor's reward fields and the experience's info; the
concatenation's rewards or its exception; OpenRLHF's log lines.

The packages ``openrlhf``, ``openrlhf.utils``, ``openrlhf.trainer`` and ``openrlhf.trainer.ppo_utils`` are
entered without running their ``__init__`` (they import deepspeed, pylatexenc and vllm, not installed here);
the modules this loads are OpenRLHF's files, unchanged. ``_process_response_into_experience`` is compiled
from ``samples_generator.py`` (which imports vllm); it needs only torch and ``Experience``."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import sys
import types
from types import SimpleNamespace

ROOT = os.environ["OPENRLHF_011_PATH"]
sys.path.insert(0, ROOT)
for name in ("openrlhf", "openrlhf.utils", "openrlhf.trainer", "openrlhf.trainer.ppo_utils"):
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(ROOT, *name.split("."))]
    sys.modules[name] = package

import torch  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
from openrlhf.utils import agent  # noqa: E402

PROMPT = "<s>[INST] 6*7? [/INST]"


class CharTokenizer:
    """One token per character (OpenRLHF decodes prompt + response tokens into the query it sends)."""

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> dict:
        return {"input_ids": torch.tensor([[ord(c) for c in text]])}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


class Engine:
    """vLLM's place: answers the case's response, stopped by itself."""

    def __init__(self, response: str) -> None:
        self.response = response

    async def generate(self, prompt_token_ids, params, multi_modal_data=None):
        out = SimpleNamespace(token_ids=[ord(c) for c in self.response], finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


def process_response_into_experience():
    path = os.path.join(ROOT, "openrlhf/trainer/ppo_utils/samples_generator.py")
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SamplesGenerator")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_process_response_into_experience")
    scope: dict = {"torch": torch, "Experience": Experience}
    exec(compile(ast.Module([fn], []), path, "exec"), scope)
    return scope["_process_response_into_experience"]


def plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def main(endpoint: str, cases: list[dict]) -> dict:
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: lines.append(r.getMessage())  # type: ignore[method-assign]
    agent.logger.addHandler(handler)
    executor = agent.SingleTurnAgentExecutor(endpoint)
    to_experience = process_response_into_experience()
    params = SimpleNamespace(max_tokens=64, logprobs=None)
    out, experiences = [], []
    for case in cases:
        o = asyncio.run(executor.execute(PROMPT, case["label"], params, 4096, CharTokenizer(), Engine(case["response"])))
        e = to_experience(None, o, max_len=4096)
        experiences.append(e)
        out.append({"reward": plain(o["reward"]), "scores": plain(o["scores"]), "extra_logs": plain(o["extra_logs"]),
                    "rewards": plain(e.rewards), "info": plain(e.info)})
    try:
        joined = Experience.concat_experiences(experiences, 0)
        concat = {"rewards": plain(joined.rewards), "info": plain(joined.info)}
    except Exception as exc:  # what the samples generator would raise
        concat = {"error": f"{type(exc).__name__}: {exc}"}
    return {"cases": out, "concat": concat, "log": lines, "reward_func": executor.reward_func is not None}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))

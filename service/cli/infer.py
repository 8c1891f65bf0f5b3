"""``grpo-curator infer``: an OpenAI-compatible inference server over transformers (rollout.infer).

grpo-curator infer --tiny --port 8100                 # the tiny random model, byte tokenizer
grpo-curator infer --model ./my-hf-model --port 8100  # any local Hugging Face directory
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from service.cli.errors import CommandFailed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo-curator infer", description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a local Hugging Face model directory")
    which.add_argument("--tiny", action="store_true", help="the tiny random model (trainer.worker.tiny_model_config)")
    parser.add_argument("--seed", type=int, default=0, help="the tiny model's initialisation seed")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--policy-version", type=int, help="sent back in the x-policy-version header")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import uvicorn

        from rollout.infer import create_app, load_engine
    except ImportError as exc:
        raise CommandFailed(f"`grpo-curator infer` needs the trainer extra ({exc.name} not installed)") from None
    engine = load_engine(args.model, seed=args.seed, policy_version=args.policy_version)
    print(f"grpo-curator infer serving {engine.name} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning")
    return 0

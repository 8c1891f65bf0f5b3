"""One complete, valid example of every request body, keyed by (method, path).

The OpenAPI document (``/openapi.json``, ``/docs``) shows them on the request bodies, ``docs/api.md``
repeats them, and a test posts each one, in order, to a real service and expects a 2xx answer, so the
examples cannot drift from what the service accepts.
"""

from __future__ import annotations

from typing import Any

PROMPTS: dict[str, Any] = {
    "prompts": [
        {
            "id": "gsm8k-17",
            "dataset": "gsm8k",
            "messages": [
                {
                    "role": "user",
                    "content": "Natalia sold 48 clips in April and half as many in May. "
                    "How many clips did she sell in total? Put the answer in \\boxed{}.",
                }
            ],
            "reference": {"answer": "72"},
            "metadata": {"split": "train"},
        }
    ]
}

REWARD_SPEC: dict[str, Any] = {
    "name": "math-boxed",
    "components": [
        {"name": "correct", "kind": "verifier.math", "weight": 1.0, "outcome": True},
        {"name": "format", "kind": "rule.format", "weight": 0.1, "params": {"pattern": "\\\\boxed\\{.+\\}"}},
    ],
}

CURATION_POLICY: dict[str, Any] = {
    "name": "dapo-like",
    "zero_variance": {"metric": "outcome", "eps": 1e-6, "action": "drop"},
    "finish_reason_actions": {"length": "penalize", "tool_failure": "drop"},
    "max_staleness": 4,
    "min_group_size": 2,
    "advantage": {"estimator": "grpo", "std": "population", "eps": 1e-6},
    "overlong_buffer": 0.2,
    "penalty": -1.0,
}

DATASET: dict[str, Any] = {"reward_spec": "math-boxed", "curation_policy": "dapo-like"}


def _trajectory(answer: str, finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "messages": [{"role": "assistant", "content": f"48 + 24 = {answer}, so \\boxed{{{answer}}}"}],
        "token_ids": [101, 102, 103, 104],
        "loss_mask": [1, 1, 1, 1],
        "logprobs": [-0.11, -0.52, -0.03, -0.9],
        "finish_reason": finish_reason,
    }


GROUP: dict[str, Any] = {
    "id": "run7-step12-gsm8k-17",
    "prompt_id": "gsm8k-17",
    "policy_version": 0,
    "sampling": {"temperature": 1.0, "max_tokens": 1024},
    "trajectories": [_trajectory("72"), _trajectory("96"), _trajectory("72"), _trajectory("7", "length")],
    "metadata": {"producer": "vllm-0"},
}

AGENT_GROUPS: dict[str, Any] = {
    "groups": [
        {
            "id": "run7-step12-calc-3",
            "prompt_id": "calc-3",
            "policy_version": 0,
            "prompt": {
                "dataset": "calc",
                "messages": [{"role": "user", "content": "What is 12 * 7? Use the calculator."}],
                "reference": {"answer": "84"},
            },
            "trajectories": [
                {
                    "messages": [
                        {
                            "role": "assistant",
                            "content": "",
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "calculator", "arguments": {"expression": "12*7"}},
                                }
                            ],
                        },
                        {"role": "tool", "content": "84", "tool_call_id": "c1"},
                        {"role": "assistant", "content": "12 * 7 = 84"},
                    ],
                    "final_answer": "84",
                    "finish_reason": "stop",
                },
                {"messages": [{"role": "assistant", "content": "It is 74."}], "finish_reason": "stop"},
            ],
        }
    ]
}

LEASE: dict[str, Any] = {
    "trainer_id": "trainer-0",
    "max_groups": 8,
    "max_staleness": 4,
    "lease_seconds": 300,
    "wait_seconds": 0,
    "request_id": "trainer-0-step-13",
}

POLICY: dict[str, Any] = {
    "version": 1,
    "metrics": {"loss": 0.013, "kl": 0.0021, "entropy": 1.92, "clip_fraction": 0.04, "grad_norm": 0.8},
}

RESCORE: dict[str, Any] = {"reward_spec": "math-boxed", "dataset": "gsm8k"}
RECURATE: dict[str, Any] = {"curation_policy": "dapo-like", "dataset": "gsm8k"}
SAMPLING_DONE: dict[str, Any] = {"request_ids": [1]}

# (method, path) -> (summary, body); in the order a new user would send them
REQUEST_EXAMPLES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("post", "/v1/reward-specs"): ("a math verifier as the outcome plus a format bonus", REWARD_SPEC),
    ("post", "/v1/curation-policies"): (
        "DAPO-style: drop zero-variance groups, penalize overlong",
        CURATION_POLICY,
    ),
    ("put", "/v1/datasets/{name}"): ("attach the spec and policy to dataset gsm8k", DATASET),
    ("post", "/v1/prompts"): ("one math prompt with its reference answer", PROMPTS),
    ("post", "/v1/groups"): ("one group of four samples of a stored prompt", GROUP),
    ("post", "/v1/policy"): ("the trainer publishes version 1 with its step metrics", POLICY),
    ("post", "/v1/batches/lease"): ("lease up to 8 ready groups", LEASE),
    ("post", "/v1/rescore"): ("score a dataset's stored groups again with the latest spec", RESCORE),
    ("post", "/v1/recurate"): ("curate a dataset's groups again under another policy", RECURATE),
    ("post", "/v1/sampling/requests/done"): ("mark claimed sampling requests done", SAMPLING_DONE),
}
EXTRA_EXAMPLES: dict[tuple[str, str], dict[str, tuple[str, dict[str, Any]]]] = {
    ("post", "/v1/groups"): {
        "batch": ("a batch: an agent group with a tool call and an inline prompt", AGENT_GROUPS)
    },
}
# bodies of routes that act on something a run creates (a lease) or that score synchronously: shown in
# OpenAPI like the others, checked against their schemas (tests/service/api/test_openapi_docs.py), not replayed
SCORE: dict[str, Any] = {
    "reward_spec": "math-boxed",
    "items": [{"prompt": "What is 6 * 7?", "completion": "The answer is \\boxed{42}", "reference": {"answer": "42"},
               "finish_reason": "stop"}],
}
OPENRLHF: dict[str, Any] = {
    "query": ["<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n\\boxed{42}<|im_end|>"],
    "prompts": ["<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"],
    "labels": ["42"],
}
NACK: dict[str, Any] = {"reason": "trajectory 3 has no logprobs and this trainer needs them", "drop": True}
EXTEND: dict[str, Any] = {"lease_seconds": 600}
SESSION: dict[str, Any] = {"group_id": "g-agent-17", "group_size": 4, "policy_version": 12, "prompt_id": "p-research-3",
                           "metadata": {"episode": 17}}
SESSION_FINISH: dict[str, Any] = {"finish_reason": "stop", "final_answer": "42", "rewards": {"tool_ok": 1.0}}
SLOT_FILL: dict[str, Any] = {"policy_version": 13, "trajectory": {
    "messages": [{"role": "assistant", "content": "The answer is \\boxed{42}"}], "token_ids": [101, 102, 7, 9],
    "loss_mask": [0, 0, 1, 1], "logprobs": [0.0, 0.0, -0.4, -0.1], "versions": [-1, -1, 13, 13],
    "finish_reason": "stop"}}
STATEFUL_EXAMPLES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("post", "/v1/score"): ("score one completion synchronously with the math-boxed spec", SCORE),
    ("post", "/compat/openrlhf/{spec}/get_reward"): ("OpenRLHF's remote reward request", OPENRLHF),
    ("post", "/v1/batches/{batch_id}/nack"): ("give a batch back; ask to drop groups it cannot use", NACK),
    ("post", "/v1/batches/{batch_id}/extend"): ("heartbeat: keep the lease 10 more minutes", EXTEND),
    ("post", "/v1/sessions"): ("open one of the four agent sessions of a group (needs an inference upstream)",
                               SESSION),
    ("post", "/v1/sessions/{session_id}/finish"): ("the agent answered; the environment reports a component",
                                                   SESSION_FINISH),
    ("post", "/v1/groups/{group_id}/trajectories/{index}"): (
        "fill a resample / resume slot of a waiting group", SLOT_FILL),
}
EXAMPLE_PATHS = {"/v1/datasets/{name}": "/v1/datasets/gsm8k"}  # the concrete path each example is sent to

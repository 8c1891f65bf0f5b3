# Two commands on a fresh machine: `make serve` (the service on the embedded PostgreSQL) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: install install-dev serve test lint demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# the service alone needs no torch
install: $(BIN)/python
	$(BIN)/pip install -q -e .

# tests and the trainer: install torch first (a CPU build where one is on disk), then the project
install-dev: $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev,trainer]"

serve: install
	$(BIN)/grpo-curator serve

test: install-dev
	$(BIN)/python -m pytest

lint: install-dev
	$(BIN)/ruff check service reward_models filters trainer rollout migrations tests bench
	$(BIN)/mypy filters reward_models trainer rollout

demo: install-dev
	$(BIN)/grpo-curator demo

clean:
	rm -rf $(VENV) .grpo-curator

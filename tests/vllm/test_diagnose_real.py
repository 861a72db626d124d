"""`backends diagnose` and `verify --deep` against the real vLLM CPU server.

The server fails in the ways it can here (a port held by another process, max_model_len above the
model's limit, a model path that does not exist, the head_dim-16 engine crash); `backends up`
points at `diagnose`, and `diagnose` names the layer from the launcher's own log. `verify --deep`
runs every check against the shared tiny-model server (the GPU part is skipped with a line).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.cli import main as gateway_main
from tests.vllm.support import (
    BACKEND_KEY,
    REPO,
    TINY_MODEL,
    TINY_MODEL_HD16,
    VLLM_PYTHON,
    VllmServer,
    free_port,
    missing_reason,
)

pytestmark = pytest.mark.vllm

# case -> (launch fields, layer, signature id)
FAILURES: dict[str, tuple[dict[str, object], str, str]] = {
    "port-held": ({}, "resources", "port-in-use"),
    "max-model-len": ({"max_model_len": 4096}, "split", "max-model-len-limit"),
    "model-path": ({"model_path": "/srv/models/no-such-model"}, "model", "model-path-missing"),
}


def _config(tmp_path: Path, port: int, launch: dict[str, object]) -> Path:
    fields = {"model_path": str(TINY_MODEL), "python": str(VLLM_PYTHON), "device": "cpu", "max_model_len": 512,
              "enforce_eager": True, "startup_timeout_s": 240,
              "extra_args": ["--kv-cache-memory-bytes", "67108864"], **launch}
    body = "\n".join(f"          {k}: {v!r}" if isinstance(v, str) else f"          {k}: {str(v).lower()}"
                     if isinstance(v, bool) else f"          {k}: {v}" for k, v in fields.items())
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(f"models:\n  - id: tiny-chat\n    upstreams:\n      - name: broken\n"
                   f"        url: http://127.0.0.1:{port}\n        model: tiny\n        launch:\n{body}\n")
    return cfg


def _gateway(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "gateway", "backends", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path, check=False)


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failed_start_is_diagnosed_from_the_launcher_log(case: str, tmp_path: Path) -> None:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    launch, layer, sig = FAILURES[case]
    holder = socket.socket()  # bound, not listening: the launcher's check passes, vLLM's bind fails
    try:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1] if case == "port-held" else free_port()
        if case != "port-held":
            holder.close()
        cfg = _config(tmp_path, port, launch)
        dirs = ["--config", str(cfg), "--log-dir", str(tmp_path / "log"), "--state-dir", str(tmp_path / "run")]
        t0 = time.monotonic()
        up = _gateway(tmp_path, "up", *dirs, timeout=300)
        failed_after = time.monotonic() - t0
    finally:
        holder.close()
    assert up.returncode == 1, up.stdout + up.stderr
    assert "the server exited with code" in up.stderr
    assert f"gateway backends diagnose broken --config {cfg} --log-dir" in up.stderr

    diag = _gateway(tmp_path, "diagnose", "broken", *dirs)
    assert diag.returncode == 1, diag.stdout + diag.stderr
    assert f"DIAGNOSIS: {layer} layer" in diag.stdout and f"[{sig}]" in diag.stdout, diag.stdout
    assert "change:" in diag.stdout
    print(f"\n{case}: `up` failed after {failed_after:.1f} s; diagnose: {layer}/{sig}")


def test_engine_crash_is_diagnosed(vllm_factory: Callable[..., VllmServer], capsys: pytest.CaptureFixture[str]) -> None:
    server = vllm_factory("diag-hd16", model_path=TINY_MODEL_HD16)
    # Healthy until the first generation.
    assert gateway_main(["backends", "diagnose", "diag-hd16", "--log", str(server.log_path)]) == 0
    assert "healthy" in capsys.readouterr().out
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4},
                   headers={"Authorization": f"Bearer {BACKEND_KEY}"}, timeout=60, trust_env=False)
    assert r.status_code == 500
    deadline = time.monotonic() + 60
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    rc = gateway_main(["backends", "diagnose", "diag-hd16", "--log", str(server.log_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "DIAGNOSIS: model layer" in out and "[cpu-head-dim]" in out and "head size 16" in out
    assert "Worker pid=" in out  # the first process to fail is the worker, not the API server


def _deep_config(tmp_path: Path, server: VllmServer, api_key: str) -> Path:
    cfg = tmp_path / "deep.yaml"
    cfg.write_text(f"""
models:
  - id: tiny-chat
    upstreams:
      - name: {server.name}
        url: {server.url}
        model: {server.served_model}
        api_key: {api_key}
        launch:
          model_path: {server.model_path}
          python: {VLLM_PYTHON}
          device: cpu
          max_model_len: 512
          log_file: {server.log_path}
""")
    return cfg


def test_verify_deep_on_the_real_cpu_backend(vllm_server: VllmServer, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _deep_config(tmp_path, vllm_server, BACKEND_KEY)
    t0 = time.monotonic()
    rc = gateway_main(["backends", "verify", "--deep", vllm_server.name, "--config", str(cfg),
                       "--state-dir", str(tmp_path)])
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    print(f"\n{out}(verify --deep took {took:.1f} s)")
    assert rc == 0, out
    assert "  ok    ranks: 1 of 1 ranks initialised" in out
    assert "  skip  gpu-memory: device cpu: no GPUs, GPU memory balance not checked" in out
    assert "  ok    request: answered in" in out
    for n in (64, 128, 256, 511):
        assert f"  ok    lengths: {n} of 512 tokens: answered in" in out
    assert "  ok    determinism: 3 of 3 temperature-0 answers identical (16 tokens" in out
    assert "0 failed, 0 warnings, 7 ok, 1 skipped" in out


def test_verify_deep_with_a_wrong_key_fails(vllm_server: VllmServer, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _deep_config(tmp_path, vllm_server, "sk-not-the-key")
    rc = gateway_main(["backends", "verify", "--deep", vllm_server.name, "--config", str(cfg),
                       "--state-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "  FAIL  request: POST /v1/completions: HTTP 401" in out
    assert "  skip  lengths: the first request failed" in out
    assert "sk-not-the-key" not in out

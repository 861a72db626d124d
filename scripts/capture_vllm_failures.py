"""Make the real vLLM CPU server fail in the ways it can on this machine and keep its logs.

    .venv/bin/python scripts/capture_vllm_failures.py [OUT_DIR] [CASE...]

Each case runs the exact command ``gateway backends up`` would run (``gateway.launch.commands``)
with one thing wrong, output to ``OUT_DIR/<case>.log`` (default ``tests/fixtures/vllm_logs/cpu``).
These logs are the fixtures of ``gateway backends diagnose``'s signature tests: real text, never
edited by hand. Needs ``.venv-vllm`` and ``var/tiny-model`` / ``var/tiny-model-hd16`` (see README).

Cases: healthy, tp2-healthy, tp2-numa-nodes, hd16-engine-crash, tp2-hd16-engine-crash,
port-in-use, max-model-len-too-long, kv-cache-too-small, model-path-missing, model-config-broken,
tp-heads-not-divisible, bad-argument.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from gateway.config import LaunchSpec, UpstreamSpec
from gateway.launch.commands import build_command

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv-vllm" / "bin" / "python"
TINY = REPO / "var" / "tiny-model"
HD16 = REPO / "var" / "tiny-model-hd16"
BASE_ARGS = ["--kv-cache-memory-bytes", "67108864"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _command(port: int, model: Path | str, max_model_len: int = 512, extra: Sequence[str] = BASE_ARGS,
             tp: int = 1, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    up = UpstreamSpec(name="tiny", url=f"http://127.0.0.1:{port}", model="tiny", launch=LaunchSpec(
        model_path=str(model), python=str(PYTHON), device="cpu", max_model_len=max_model_len,
        enforce_eager=True, tensor_parallel_size=tp, extra_args=list(extra), env=env or {}))
    cmd = build_command(up)
    return list(cmd.argv), cmd.child_env(os.environ)


def _run(argv: list[str], env: dict[str, str], log: Path, timeout: float = 300) -> int:
    with open(log, "wb") as out:
        out.write(f"$ {' '.join(argv[1:])}\n".encode())
        out.flush()
        done = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=timeout, check=False)
    log.write_bytes(neutral_paths(log.read_bytes()))
    return done.returncode


def neutral_paths(text: bytes) -> bytes:
    """The log as it would read on a server: this checkout is /srv/vllm-gateway, the interpreter's own
    library /usr/lib/python3.X (the repo carries no path of the machine that captured it)."""
    stdlib = str(Path(os.__file__).parent)
    return text.replace(str(REPO).encode(), b"/srv/vllm-gateway").replace(
        stdlib.encode(), f"/usr/lib/{Path(stdlib).name}".encode())


# Two CPU ranks on a one-NUMA-node machine need their cores named (vLLM's automatic binding wants one
# NUMA node per rank): rank 0 on core 0, rank 1 on core 1.
TP2_BIND = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


def _serve_one_request(log: Path, model: Path, tp: int = 1, extra_env: dict[str, str] | None = None) -> int:
    """Start, wait for /health, send one completion, then stop the server (SIGTERM) if still up."""
    port = _free_port()
    argv, env = _command(port, model, tp=tp, env=extra_env)
    with open(log, "wb") as out:
        out.write(f"$ {' '.join(argv[1:])}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            if proc.poll() is not None:
                return proc.returncode
            httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4},
                       timeout=60, trust_env=False)
            try:
                return proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.terminate()
                return proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def hd16_engine_crash(log: Path) -> int:
    """Serves /health, then the first generation kills the engine (no CPU kernel for head size 16)."""
    return _serve_one_request(log, HD16)


def tp2_hd16_engine_crash(log: Path) -> int:
    """The same with tensor_parallel_size 2: two workers (ranks), both hit the missing kernel."""
    return _serve_one_request(log, HD16, tp=2, extra_env=TP2_BIND)


def healthy(log: Path) -> int:
    """A good start and one answered request, then a normal stop."""
    return _serve_one_request(log, TINY)


def tp2_healthy(log: Path) -> int:
    """A good start with tensor_parallel_size 2 (two ranks initialise), one request, a normal stop."""
    return _serve_one_request(log, TINY, tp=2, extra_env=TP2_BIND)


def tp2_numa_nodes(log: Path) -> int:
    """tensor_parallel_size 2 with vLLM's automatic CPU binding on a machine with one NUMA node."""
    argv, env = _command(_free_port(), TINY, tp=2)
    return _run(argv, env, log)


def port_in_use(log: Path) -> int:
    """Another process listens on the backend's port (a leftover server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        argv, env = _command(s.getsockname()[1], TINY)
        return _run(argv, env, log)


def max_model_len_too_long(log: Path) -> int:
    """max_model_len 4096 for a model with max_position_embeddings 2048."""
    argv, env = _command(_free_port(), TINY, max_model_len=4096)
    return _run(argv, env, log)


def kv_cache_too_small(log: Path) -> int:
    """1 MiB of KV cache (1024 tokens of the tiny model) for max_model_len 2048."""
    argv, env = _command(_free_port(), TINY, max_model_len=2048, extra=["--kv-cache-memory-bytes", "1048576"])
    return _run(argv, env, log)


def model_path_missing(log: Path) -> int:
    argv, env = _command(_free_port(), "/srv/models/no-such-model")
    return _run(argv, env, log)


def model_config_broken(log: Path) -> int:
    """A model directory whose config.json is cut off (an interrupted copy)."""
    with tempfile.TemporaryDirectory(prefix="broken-model-") as tmp:
        model = Path(tmp) / "tiny-model"
        shutil.copytree(TINY, model)
        text = (model / "config.json").read_text()
        (model / "config.json").write_text(text[: len(text) // 2])
        argv, env = _command(_free_port(), model)
        return _run(argv, env, log)


def tp_heads_not_divisible(log: Path) -> int:
    """tensor_parallel_size 3 for a model with 4 attention heads."""
    argv, env = _command(_free_port(), TINY, tp=3)
    return _run(argv, env, log)


def bad_argument(log: Path) -> int:
    """A dtype vLLM does not know (extra_args --dtype float42): argparse stops it (no signature for this)."""
    argv, env = _command(_free_port(), TINY, extra=[*BASE_ARGS, "--dtype", "float42"])
    return _run(argv, env, log)


CASES = {
    "healthy": healthy,
    "tp2-healthy": tp2_healthy,
    "tp2-hd16-engine-crash": tp2_hd16_engine_crash,
    "tp2-numa-nodes": tp2_numa_nodes,
    "hd16-engine-crash": hd16_engine_crash,
    "port-in-use": port_in_use,
    "max-model-len-too-long": max_model_len_too_long,
    "kv-cache-too-small": kv_cache_too_small,
    "model-path-missing": model_path_missing,
    "model-config-broken": model_config_broken,
    "tp-heads-not-divisible": tp_heads_not_divisible,
    "bad-argument": bad_argument,
}


def main(argv: Sequence[str]) -> int:
    out = Path(argv[0]) if argv else REPO / "tests" / "fixtures" / "vllm_logs" / "cpu"
    names = list(argv[1:]) or list(CASES)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name in names:
        t0 = time.monotonic()
        rc = CASES[name](out / f"{name}.log")
        summary[name] = {"exit": rc, "seconds": round(time.monotonic() - t0, 1)}
        print(name, summary[name], flush=True)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

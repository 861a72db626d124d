"""gateway.launch.process and `gateway backends ...` against a fake vLLM *process*.

The fake is a stdlib HTTP server installed as a package named ``vllm`` in a temporary directory
and put on PYTHONPATH through ``launch.env``, so the launcher runs exactly the argv it would run
for real (``python -m vllm.entrypoints.openai.api_server --model ... --port ...``). It forks a
child (like vLLM's EngineCore) so stopping must reach the whole process group, enforces
``VLLM_API_KEY`` like vLLM does, and misbehaves on request (FAKE_VLLM_MODE): ``exit`` (dies while
starting), ``never`` (never serves), ``ignore-term`` (SIGTERM does nothing). The real-vLLM
version of these checks is tests/vllm/test_backends_real.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import main as gateway_main
from gateway.config import UpstreamSpec, parse_config
from gateway.launch.commands import build_command
from gateway.launch.process import (
    BackendRecord,
    LaunchFailed,
    StateFile,
    group_members,
    proc_info,
    start_backend,
    stop_backends,
    stop_records,
    wait_ready,
)

FAKE_SERVER = r'''
import argparse, json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--model"); p.add_argument("--served-model-name"); p.add_argument("--host")
p.add_argument("--port", type=int)
args, _ = p.parse_known_args()
mode = os.environ.get("FAKE_VLLM_MODE", "ok")
key = os.environ.get("VLLM_API_KEY")
print(f"fake vllm: mode={mode} key_set={key is not None} argv={sys.argv[1:]}", flush=True)
child_code = "import signal, time\n"
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child_code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
child = subprocess.Popen([sys.executable, "-c", child_code + "time.sleep(3600)"])  # the "EngineCore"
if mode == "exit":
    print("boom: engine failed to start (fake)", flush=True)
    child.kill(); child.wait()
    sys.exit(3)
time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0.3")))
if mode == "never":
    time.sleep(3600)

class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            return self._send(200, None)
        if self.path.startswith("/v1"):
            if key and self.headers.get("authorization", "") != f"Bearer {key}":
                return self._send(401, {"error": "Unauthorized"})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": args.served_model_name}]})
        self._send(404, {"detail": "Not Found"})

srv = ThreadingHTTPServer((args.host, args.port), H)
def stop(*_):
    child.terminate(); child.wait()
    os._exit(0)
if mode != "ignore-term":
    signal.signal(signal.SIGTERM, stop)
srv.serve_forever()
'''


@pytest.fixture(scope="module")
def fake_vllm_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("fakevllm")
    pkg = root / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_SERVER)
    return str(root)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config_yaml(fake_path: str, port: int, *, mode: str = "ok", key: str = "sk-fake-backend",
                model: str = "fake", timeout: float = 30, name: str = "fake-a") -> str:
    return textwrap.dedent(f"""
        models:
          - id: fake-chat
            upstreams:
              - name: {name}
                url: http://127.0.0.1:{port}
                model: {model}
                api_key: {key}
                launch:
                  model_path: /models/fake
                  python: {sys.executable}
                  device: cpu
                  startup_timeout_s: {timeout}
                  env: {{PYTHONPATH: "{fake_path}", FAKE_VLLM_MODE: "{mode}"}}
        """)


def upstream(fake_path: str, port: int, **kw: object) -> UpstreamSpec:
    return parse_config(config_yaml(fake_path, port, **kw), {}).upstreams()[0][1]  # type: ignore[arg-type]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateFile]:
    st = StateFile(tmp_path / "run")
    yield st
    leftover = list(st.load().values())
    if leftover:
        stop_records(leftover, timeout_s=2, state=st)


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_start_wait_stop_whole_group(fake_vllm_path: str, tmp_path: Path, state: StateFile) -> None:
    cmd = build_command(upstream(fake_vllm_path, free_port()), log_dir=str(tmp_path / "log"))
    b = start_backend(cmd, state=state)
    wait_ready([b])
    assert b.ready_after_s is not None and b.ready_after_s < 20
    rec = state.load()[cmd.name]
    assert (rec.pid, rec.pgid, rec.port) == (b.pid, b.pid, cmd.port)
    members = group_members(rec.pgid)
    assert len(members) == 2  # the server and its "engine" child
    assert all("sk-fake-backend" not in cmdline(p) for p in members)
    environ = (Path("/proc") / str(b.pid) / "environ").read_bytes().split(b"\0")
    assert b"VLLM_API_KEY=sk-fake-backend" in environ
    log = (tmp_path / "log" / f"{cmd.name}.log").read_text()
    assert "key_set=True" in log and "--served-model-name" in log and "sk-fake-backend" not in log

    [res] = stop_backends([b], timeout_s=10, state=state)
    assert res.outcome == "stopped"
    assert group_members(rec.pgid) == []
    assert b.poll() == 0
    assert state.load() == {}


def test_fails_fast_with_log_tail_when_the_server_exits(fake_vllm_path: str, tmp_path: Path,
                                                        state: StateFile) -> None:
    cmd = build_command(upstream(fake_vllm_path, free_port(), mode="exit"), log_dir=str(tmp_path))
    b = start_backend(cmd, state=state)
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed) as exc:
        wait_ready([b])
    assert time.monotonic() - t0 < 15
    assert "exited with code 3" in str(exc.value)
    assert "boom: engine failed to start" in exc.value.log_tail
    stop_backends([b], timeout_s=2, state=state)


def test_startup_timeout(fake_vllm_path: str, tmp_path: Path, state: StateFile) -> None:
    cmd = build_command(upstream(fake_vllm_path, free_port(), mode="never", timeout=1.0), log_dir=str(tmp_path))
    b = start_backend(cmd, state=state)
    with pytest.raises(LaunchFailed, match=r"not ready after 1 s"):
        wait_ready([b])
    [res] = stop_backends([b], timeout_s=5, state=state)
    assert res.outcome == "stopped"
    assert group_members(b.pid) == []


def test_sigkill_after_the_stop_timeout(fake_vllm_path: str, tmp_path: Path, state: StateFile) -> None:
    cmd = build_command(upstream(fake_vllm_path, free_port(), mode="ignore-term"), log_dir=str(tmp_path))
    b = start_backend(cmd, state=state)
    wait_ready([b])
    [res] = stop_backends([b], timeout_s=0.5, state=state)
    assert res.outcome == "killed"
    assert group_members(b.pid) == []
    assert b.poll() == -signal.SIGKILL


def test_port_in_use_is_refused_before_starting(fake_vllm_path: str, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = build_command(upstream(fake_vllm_path, port), log_dir=str(tmp_path))
        with pytest.raises(LaunchFailed, match="already in use"):
            start_backend(cmd)


def test_missing_interpreter(tmp_path: Path) -> None:
    up = parse_config(textwrap.dedent(f"""
        models:
          - id: m
            upstreams:
              - url: http://127.0.0.1:{free_port()}
                model: x
                launch: {{model_path: m, python: /nonexistent/bin/python}}
        """), {}).upstreams()[0][1]
    with pytest.raises(LaunchFailed, match="cannot run '/nonexistent/bin/python'"):
        start_backend(build_command(up, log_dir=str(tmp_path)))


def test_stale_records_are_dropped_without_signalling(tmp_path: Path) -> None:
    st = StateFile(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = proc_info(os.getpid())
    assert me is not None
    records = [
        BackendRecord("gone", dead.pid, dead.pid, "127.0.0.1", 1, "http://127.0.0.1:1", "x.log", 0.0, 1),
        # our own pid, but "started" at another time: a reused pid must not be signalled
        BackendRecord("reused", os.getpid(), me.pgid, "127.0.0.1", 1, "http://127.0.0.1:1", "x.log", 0.0,
                      me.start_ticks + 1),
    ]
    for r in records:
        st.put(r)
    assert not any(r.is_running() for r in records)
    results = stop_records(list(st.load().values()), timeout_s=1, state=st)
    assert sorted((r.name, r.outcome) for r in results) == [("gone", "not running"), ("reused", "not running")]
    assert st.load() == {}


def test_state_file_survives_garbage(tmp_path: Path) -> None:
    st = StateFile(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    st.path.write_text("{not json")
    assert st.load() == {}
    st.put(BackendRecord("a", 1, 1, "h", 1, "u", "l", 0.0))
    assert json.loads(st.path.read_text())["backends"]["a"]["pid"] == 1


# --------------------------------------------------------------------------- the CLI


def gateway(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def test_cli_up_detach_verify_down(fake_vllm_path: str, tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(config_yaml(fake_vllm_path, port))
    run_dir, log_dir = str(tmp_path / "run"), str(tmp_path / "log")

    r = gateway("backends", "command", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert '--api-key "$VLLM_API_KEY"' in r.stdout and "sk-fake-backend" not in r.stdout

    r = gateway("backends", "up", "--detach", "--config", str(cfg), "--state-dir", run_dir, "--log-dir", log_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fake-a: ready at" in r.stdout
    rec = StateFile(run_dir).load()["fake-a"]
    assert len(group_members(rec.pgid)) == 2

    # GATEWAY_CONFIG is the fallback for --config
    r = gateway("backends", "verify", env={"GATEWAY_CONFIG": str(cfg)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fake-a: ok" in r.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text(config_yaml(fake_vllm_path, port, key="sk-wrong"))
    r = gateway("backends", "verify", "--config", str(bad))
    assert r.returncode == 1 and "fake-a: key mismatch" in r.stdout

    bad.write_text(config_yaml(fake_vllm_path, port, model="other"))
    r = gateway("backends", "verify", "--config", str(bad))
    assert r.returncode == 1 and "fake-a: model name mismatch" in r.stdout and "serves: fake" in r.stdout

    r = gateway("backends", "up", "--detach", "--config", str(cfg), "--state-dir", run_dir)
    assert r.returncode == 0 and "already running" in r.stdout

    r = gateway("backends", "status", "--state-dir", run_dir)
    assert r.returncode == 0 and "fake-a: running" in r.stdout

    r = gateway("backends", "down", "--state-dir", run_dir)
    assert r.returncode == 0, r.stderr
    assert "fake-a: stopped" in r.stdout
    assert group_members(rec.pgid) == []
    r = gateway("backends", "down", "--state-dir", run_dir)
    assert r.returncode == 0 and "nothing to stop" in r.stdout

    r = gateway("backends", "verify", "--config", str(cfg))
    assert r.returncode == 1 and "fake-a: down" in r.stdout


def test_cli_foreground_up_stops_on_ctrl_c(fake_vllm_path: str, tmp_path: Path) -> None:
    proc, run_dir = _foreground_up(fake_vllm_path, tmp_path)
    try:
        rec = StateFile(run_dir).load()["fake-a"]
        assert group_members(rec.pgid)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "fake-a: stopped" in out
    assert group_members(rec.pgid) == []
    assert StateFile(run_dir).load() == {}


def test_cli_reports_config_and_name_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gateway_main(["backends", "verify", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the file" in capsys.readouterr().err
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("models:\n  - id: m\n    upstreams:\n      - {url: 'http://127.0.0.1:1', model: x}\n")
    assert gateway_main(["backends", "up", "--config", str(cfg)]) == 2
    assert "no upstream in the config has a `launch:` section" in capsys.readouterr().err
    assert gateway_main(["backends", "command", "nope", "--config", str(cfg)]) == 2
    assert "no upstream named 'nope'" in capsys.readouterr().err
    assert gateway_main(["backends", "verify", "--config", str(cfg), "--timeout", "1"]) == 1
    assert "m-0: down" in capsys.readouterr().out


def _foreground_up(fake_vllm_path: str, tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """`gateway backends up` in the foreground on one fake backend, read until it serves; (process, state dir)."""
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(config_yaml(fake_vllm_path, free_port()))
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "backends", "up", "--config", str(cfg), "--state-dir", run_dir,
         "--log-dir", str(tmp_path / "log")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Ctrl-C stops them" in line:
            break
    if not any("ready at" in ln for ln in lines):
        proc.kill()
        proc.communicate()
        raise AssertionError(f"`backends up` never became ready: {lines}")
    return proc, run_dir


def test_cli_foreground_up_ends_quietly_when_down_stops_it(fake_vllm_path: str, tmp_path: Path) -> None:
    proc, run_dir = _foreground_up(fake_vllm_path, tmp_path)
    try:
        r = gateway("backends", "down", "--state-dir", run_dir)
        assert r.returncode == 0 and "fake-a: stopped" in r.stdout
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "fake-a: stopped by `gateway backends down`" in out


def test_cli_foreground_up_reports_a_crashed_backend(fake_vllm_path: str, tmp_path: Path) -> None:
    proc, run_dir = _foreground_up(fake_vllm_path, tmp_path)
    try:
        rec = StateFile(run_dir).load()["fake-a"]
        os.kill(rec.pid, signal.SIGKILL)  # the API server dies; its "engine" child lingers
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out
    assert "the server was killed by SIGKILL while serving" in out
    assert "fake vllm: mode=ok" in out  # the log tail
    # The dead server's "engine" child was stopped too; nothing is left, no record either.
    assert "fake-a: stopped" in out
    assert group_members(rec.pgid) == []
    assert StateFile(run_dir).load() == {}


def test_cli_up_failure_points_at_diagnose(fake_vllm_path: str, tmp_path: Path) -> None:
    """A backend that dies while starting: `up` names the `diagnose` command, which reads its log."""
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(config_yaml(fake_vllm_path, free_port(), mode="exit"))
    dirs = ["--config", str(cfg), "--state-dir", str(tmp_path / "run"), "--log-dir", str(tmp_path / "log")]
    r = gateway("backends", "up", *dirs)
    assert r.returncode == 1 and "exited with code 3" in r.stderr
    assert f"gateway backends diagnose fake-a --config {cfg} --log-dir {tmp_path / 'log'}" in r.stderr
    r = gateway("backends", "diagnose", "fake-a", *dirs)
    assert r.returncode == 1, r.stdout + r.stderr  # the fake writes no vLLM error: a silent death
    assert "never reported serving" in r.stdout and "boom: engine failed to start (fake)" in r.stdout
    r = gateway("backends", "verify", "--deep", "--config", str(cfg))
    assert r.returncode == 2 and "verify --deep checks one backend" in r.stderr

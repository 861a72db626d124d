"""The `gateway` command as a user runs it: real processes, real ports."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.fakes import FakeVLLM
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY

GATEWAY = [sys.executable, "-m", "gateway"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_config(tmp_path: Path, fake: FakeVLLM) -> Path:
    cfg = {
        "models": [{"id": "public-chat", "upstreams": [
            {"name": "fake0", "url": fake.url, "model": "tiny", "api_key": "${TEST_BACKEND_KEY}"}]}],
        "keys": [{"name": "ci", "key_sha256": hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else b""
            raise AssertionError(f"gateway exited with {proc.returncode}: {err!r}")
        try:
            if httpx.get(url + "/health/ready", timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("gateway did not become ready")


@pytest.fixture
def serve(tmp_path: Path, fake: FakeVLLM) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> tuple[str, subprocess.Popen[bytes]]:
        port = _free_port()
        env = {**os.environ, "TEST_BACKEND_KEY": BACKEND_KEY, "GATEWAY_PORT": str(port),
               "GATEWAY_LOG_FORMAT": "json", **(env or {})}
        proc = subprocess.Popen([*GATEWAY, "serve", "--config", str(_write_config(tmp_path, fake)), *extra],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # its own group: workers included in the cleanup
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc)
        return url, proc

    yield start  # type: ignore[misc]
    for p in procs:
        if p.poll() is None:
            p.terminate()  # uvicorn's supervisor stops its workers on SIGTERM
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # whatever is left of the group (workers, trackers)
        p.wait(10)
        for stream in (p.stdout, p.stderr):
            if stream:
                stream.close()


def test_serve_answers_the_sdk_logs_json_without_secrets_and_stops_on_sigterm(serve, fake: FakeVLLM) -> None:  # type: ignore[no-untyped-def]
    url, proc = serve()
    with openai.OpenAI(base_url=url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
        r = c.chat.completions.create(model="public-chat", messages=[{"role": "user", "content": "hi"}])
        assert r.model == "public-chat"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
    assert proc.stderr is not None
    log = proc.stderr.read().decode()
    assert '"logger":"gateway.access"' in log and '"status":200' in log and '"key":"ci"' in log
    assert CLIENT_KEY not in log and BACKEND_KEY not in log


def test_graceful_shutdown_lets_open_streams_finish(serve, fake: FakeVLLM) -> None:  # type: ignore[no-untyped-def]
    url, proc = serve()
    fake.behaviour.token_delay = 0.1
    with httpx.stream("POST", url + "/v1/chat/completions", headers={"Authorization": f"Bearer {CLIENT_KEY}"},
                      json={"model": "public-chat", "messages": [{"role": "user", "content": "x"}],
                            "max_tokens": 10, "stream": True}, timeout=20) as r:
        it = r.iter_bytes()
        first = next(it)
        proc.send_signal(signal.SIGTERM)
        rest = b"".join(it)
    assert first and (first + rest).endswith(b"data: [DONE]\n\n")
    assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown


def test_several_workers_share_one_view_of_the_metrics(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    metrics_dir = tmp_path / "metrics"
    url, _proc = serve("--workers", "2", env={"GATEWAY_METRICS_DIR": str(metrics_dir)})
    pids = set()
    for _ in range(12):  # new connections, so both workers take some
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as c:
            r = c.post("/v1/chat/completions", json={"model": "public-chat",
                                                     "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200, r.text
    for name in metrics_dir.glob("*.db"):
        pids.add(name.stem.rsplit("_", 1)[-1])
    assert len(pids) == 2  # both workers recorded something
    line = 'gateway_requests_total{model="public-chat",route="/v1/chat/completions",status_class="2xx"} 12.0'
    for _ in range(4):  # whichever worker answers the scrape adds up both
        with httpx.Client(base_url=url) as c:
            assert line in c.get("/metrics").text


def test_check_config(tmp_path: Path, fake: FakeVLLM) -> None:
    good = _write_config(tmp_path, fake)
    env = {**os.environ, "TEST_BACKEND_KEY": "x"}
    ok = subprocess.run([*GATEWAY, "check-config", str(good)], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "OK (1 models, 1 upstreams, 1 keys)" in ok.stdout
    env.pop("TEST_BACKEND_KEY")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - id: a\n    upstreams: [{url: 'localhost:8000', model: m, api_key: '${NOPE_X}'}]\n"
                   "  - id: a\n    upstreams: [{url: 'http://h:1', model: m, colour: red}]\n")
    r = subprocess.run([*GATEWAY, "check-config", str(bad)], env=env, capture_output=True, text=True)
    assert r.returncode == 1
    assert "models[0].upstreams[0].api_key: environment variable ${NOPE_X} is not set" in r.stderr
    r = subprocess.run([*GATEWAY, "check-config", str(good)], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "TEST_BACKEND_KEY" in r.stderr
    r = subprocess.run([*GATEWAY, "serve", "--config", str(good)], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "TEST_BACKEND_KEY" in r.stderr  # refused at start-up, not at first request


def test_keys_new_prints_a_key_and_its_hash() -> None:
    out = subprocess.run([*GATEWAY, "keys", "new", "--name", "team-a"], capture_output=True, text=True).stdout
    key = re.search(r"^\s+(sk-gw-\S+)$", out, re.M)
    digest = re.search(r'key_sha256: "([0-9a-f]{64})"', out)
    assert key and digest and hashlib.sha256(key.group(1).encode()).hexdigest() == digest.group(1)
    assert "name: team-a" in out

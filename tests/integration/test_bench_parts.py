"""The benchmark's own parts: the Python floor relay (a real process in front of the fake vLLM) and the
ratio arithmetic of its report. The benchmark itself is run by `make bench`, never timed in tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from loadtest.bench.loadgen import RunResult
from loadtest.bench.report import case_summary
from loadtest.bench.scenarios import CASES
from tests.fakes import FakeVLLM
from tests.fakes.plugin import FakeVLLMFactory

REPO = Path(__file__).resolve().parents[2]
CLIENT = "sk-floor-client"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def floor(fake_vllm: FakeVLLMFactory) -> Iterator[tuple[str, FakeVLLM]]:
    fake = fake_vllm()
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "loadtest" / "floor_relay.py"), "--port", str(port), "--upstream", fake.url,
         "--upstream-key", "sk-backend-test", "--client-key", CLIENT, "--model", "public=tiny"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "floor relay did not start"
            time.sleep(0.05)
        yield url, fake
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_floor_relay_checks_the_key_maps_the_model_and_relays_bytes(floor: tuple[str, FakeVLLM]) -> None:
    url, fake = floor
    body = {"model": "public", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
    with httpx.Client(base_url=url, trust_env=False, timeout=10) as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 401
        r = c.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {CLIENT}"})
        assert r.status_code == 200 and r.json()["model"] == "tiny"  # answer bytes are not mapped back
        sent = fake.requests_to("/v1/chat/completions")[-1]
        assert sent.json["model"] == "tiny" and sent.headers["authorization"] == "Bearer sk-backend-test"
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                      headers={"authorization": f"Bearer {CLIENT}"}) as s:
            text = s.read().decode()
        assert s.headers["content-type"].startswith("text/event-stream")
        assert text.count("data: ") == 3 + 2 and text.endswith("data: [DONE]\n\n")


def _run(target: str, rps: float, p50: float, ttfb99: float | None, cpu: float | None) -> RunResult:
    return RunResult("B", target, 64, 100, 0, 1.0, rps, {"p50": p50, "p95": p50, "p99": p50, "mean": p50,
                                                         "max": p50},
                     {"p50": 1.0, "p95": 1.0, "p99": ttfb99} if ttfb99 is not None else None,
                     {"proxy": cpu} if cpu is not None else {}, None)


def test_report_ratios_and_goals() -> None:
    rows = [_run("direct", 10000, 1.0, None, None), _run("nginx", 9000, 1.2, None, 0.02),
            _run("floor", 5000, 1.4, None, 0.2), _run("gateway", 4500, 1.5, None, 0.22)]
    rps, cpu = case_summary(CASES["B"], rows)
    assert rps["values"]["gateway"] == 4500 and rps["gateway_ratio"]["floor"] == pytest.approx(0.9)
    assert rps["met"] is True  # >= 0.85 x floor
    assert cpu["case"] == "B-cpu" and cpu["gateway_ratio"]["floor"] == pytest.approx(1.1) and cpu["met"] is True
    (added,) = case_summary(CASES["A"], rows)
    assert added["values"]["gateway"] == pytest.approx(0.5) and added["values"]["floor"] == pytest.approx(0.4)
    assert added["met"] is False  # 0.5 > 0.4 + 0.05
    assert added["gateway_ratio"]["direct"] is None  # an added time has no ratio to direct
    d_rows = [_run("direct", 1, 1, 10.0, None), _run("floor", 1, 1, 12.0, 1.0), _run("gateway", 1, 1, 13.0, 1.0)]
    (d,) = case_summary(CASES["D"], d_rows)
    assert d["values"]["gateway"] == pytest.approx(3.0) and d["met"] is True  # 3 <= 1.5 x 2
    e_rows = [_run("direct", 1, 1, 10.0, None), _run("gateway", 1, 1, 12.0, 1.0)]
    (e,) = case_summary(CASES["E"], e_rows)
    assert e["values"]["gateway"] == 0 and e["met"] is True  # judged without the floor
    (e_bad,) = case_summary(CASES["E"], [e_rows[0], replace(e_rows[1], errors=3)])
    assert e_bad["values"]["gateway"] == 3 and e_bad["met"] is False

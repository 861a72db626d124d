"""`gateway loadtest` against fake vLLM servers on 127.0.0.1: counts, error groups, verdict, reports, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from tests.fakes import FakeVLLM, ResetAfter, Respond
from tests.fakes.plugin import FakeVLLMFactory

KEY = "sk-backend-test"
REPO = Path(__file__).resolve().parents[2]
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def loadtest(tmp_path: Path, fake: FakeVLLM, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "run.json"
    rc = main(["loadtest", "--base-url", fake.url, "--key", KEY, "--model", "tiny", "--no-progress",
               "--json", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_failure_mix_gives_the_right_counts_groups_and_a_fail(
    fake_vllm: FakeVLLMFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_vllm()
    fake.fail_next(5)  # vLLM's dead-engine 500
    fake.inject(Respond(502, b"<html>bad gateway</html>", "text/html"), times=2)
    # the stream breaks after two events (FIN: a reset could discard the unread headers as well)
    fake.inject(ResetAfter(chunks=2, rst=False), times=3)
    rc, doc = loadtest(tmp_path, fake, "-n", "64", "-c", "8", "--stream", "--max-tokens", "4")
    assert rc == 1
    (s,) = doc["targets"]
    assert (s["requests"], s["ok"], s["failed"]) == (64, 54, 10)
    assert s["status_counts"] == {"200": 57, "500": 5, "502": 2}
    groups = {g["kind"]: (g["count"], g["example"]) for g in s["errors"]}
    assert groups == {
        "HTTP 500 InternalServerError": (5, ENGINE_DEAD),
        "protocol_error": (3, "peer closed connection without sending complete message body (incomplete chunked read)"),
        "HTTP 502": (2, "<html>bad gateway</html>"),
    }
    assert s["output_tokens"] == 54 * 4  # from the usage of the last stream chunk
    assert s["ttft_s"]["p50"] <= s["latency_s"]["p50"]
    assert doc["verdict"]["passed"] is False
    assert doc["verdict"]["reasons"] == ["success rate 84.4% < 95.0%"]
    assert len(doc["requests"]) == 64 and sum(r["error_kind"] is None for r in doc["requests"]) == 54
    assert len(fake.requests_to("/v1/chat/completions")) == 64
    text = capsys.readouterr().out
    assert "FAIL" in text and "84.4% (54/64)" in text and "HTTP 500 InternalServerError" in text
    assert KEY not in text and KEY not in json.dumps(doc)


def test_a_lower_bar_passes_and_a_slow_backend_fails_on_latency(fake_vllm: FakeVLLMFactory, tmp_path: Path) -> None:
    fake = fake_vllm()
    fake.fail_next(3)
    rc, doc = loadtest(tmp_path, fake, "-n", "40", "-c", "4", "--min-success", "0.9")
    assert rc == 0 and doc["verdict"]["label"] == "PASS"
    s = doc["targets"][0]
    assert (s["ok"], s["failed"]) == (37, 3)
    assert s["ttft_s"] is None and s["output_tokens"] == 37 * 64  # non-streaming: usage.completion_tokens

    fake.behaviour.first_token_delay = 0.05
    rc, doc = loadtest(tmp_path, fake, "-n", "8", "-c", "4", "--max-avg-latency", "20ms", "--max-tokens", "2")
    assert rc == 1
    assert doc["targets"][0]["success_rate"] == 1.0
    assert doc["verdict"]["reasons"][0].startswith("average latency")


def test_wrong_key_groups_as_401_and_nothing_succeeds(fake_vllm: FakeVLLMFactory, tmp_path: Path) -> None:
    fake = fake_vllm()
    out = tmp_path / "run.json"
    rc = main(["loadtest", "--base-url", fake.url + "/v1/", "--key", "sk-wrong", "--model", "tiny", "-n", "6",
               "--no-progress", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 1
    assert doc["targets"][0]["errors"] == [{"kind": "HTTP 401", "count": 6, "example": "Unauthorized"}]
    assert doc["verdict"]["reasons"] == ["success rate 0.0% < 95.0%", "no successful request, so no latency"]


def test_duration_bound_run_stops_on_time(fake_vllm: FakeVLLMFactory, tmp_path: Path) -> None:
    fake = fake_vllm()
    fake.behaviour.first_token_delay = 0.01
    t0 = time.monotonic()
    rc, doc = loadtest(tmp_path, fake, "--duration", "1s", "-c", "4", "--max-tokens", "2")
    took = time.monotonic() - t0
    assert rc == 0
    assert 1.0 <= doc["elapsed_s"] < 20 and took < 40  # generous: a loaded machine
    assert doc["targets"][0]["requests"] >= 4 and doc["requests_per_target"] is None


def test_compare_alternates_rounds_and_reports_ratios(fake_vllm: FakeVLLMFactory, tmp_path: Path) -> None:
    fast, slow = fake_vllm(), fake_vllm(served_models=("other",), api_key="sk-b")
    slow.behaviour.first_token_delay = 0.2
    out = tmp_path / "cmp.json"
    rc = main(["loadtest", "--base-url", fast.url, "--key", KEY, "--model", "tiny", "-n", "16", "-c", "4",
               "--max-tokens", "2", "--compare", slow.url, "--compare-key", "sk-b", "--compare-model", "other",
               "--no-progress", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0
    a, b = doc["targets"]
    assert (a["requests"], b["requests"]) == (16, 16) and a["ok"] == b["ok"] == 16
    assert len(fast.requests) == 16 and len(slow.requests) == 16
    assert {r.json["model"] for r in slow.requests} == {"other"}
    # rounds of max(4, 16/8) = 4 requests: A, B, A, B, ...
    order = [r["target"] for r in sorted(doc["requests"], key=lambda r: r["started"])]
    assert order == (["A"] * 4 + ["B"] * 4) * 4
    assert doc["ratios"]["latency_p50"] < 0.8  # A is the fast one
    assert doc["ratios"]["requests_per_s"] > 1.2
    assert doc["ratios"]["success_rate"] == 1.0


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.svg_titles: list[str] = []
        self.external: list[str] = []
        self.rects = 0
        self.polylines = 0
        self._in_svg_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.external.append(value)
        if tag == "svg":
            self.svg_titles.append(dict(attrs).get("aria-label") or "")
        self.rects += tag == "rect"
        self.polylines += tag == "polyline"


def test_html_report_is_one_self_contained_page_with_three_charts(
    fake_vllm: FakeVLLMFactory, tmp_path: Path
) -> None:
    fake = fake_vllm()
    fake.fail_next(2)
    page_path = tmp_path / "report.html"
    rc, _ = loadtest(tmp_path, fake, "-n", "40", "-c", "6", "--stream", "--max-tokens", "3",
                       "--html", str(page_path))
    assert rc == 0
    text = page_path.read_text()
    page = _Page()
    page.feed(text)
    page.close()
    assert page.svg_titles == ["Latency of successful requests", "Time to first token",
                               "Completed requests per second"]
    assert page.external == [] and "script" not in page.tags and "link" not in page.tags
    assert page.rects > 6 and page.polylines == 2  # ok and failed completions over time
    assert "HTTP 500 InternalServerError" in text and "PASS" in text and KEY not in text


def test_bad_arguments_exit_2(fake_vllm: FakeVLLMFactory, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("LOADTEST_KEY", raising=False)
    assert main(["loadtest", "--base-url", "http://127.0.0.1:1", "--model", "m"]) == 2
    assert "no key" in capsys.readouterr().err
    assert main(["loadtest", "--base-url", "127.0.0.1:1", "--key", "k", "--model", "m"]) == 2
    assert "not an http(s) URL" in capsys.readouterr().err
    assert main(["loadtest", "--base-url", "http://h", "--key", "k", "--model", "m", "--compare-key", "x"]) == 2
    with pytest.raises(SystemExit) as info:
        main(["loadtest", "--base-url", "http://h", "--key", "k", "--model", "m", "--duration", "soon"])
    assert info.value.code == 2


def test_unreachable_endpoint_is_a_connect_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    out = tmp_path / "r.json"
    rc = main(["loadtest", "--base-url", f"http://127.0.0.1:{port}", "--key", "k", "--model", "m", "-n", "3",
               "--no-progress", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 1
    assert doc["targets"][0]["status_counts"] == {"no answer": 3}
    assert [g["kind"] for g in doc["targets"][0]["errors"]] == ["connect_error"]


def test_ctrl_c_prints_the_partial_summary(fake_vllm: FakeVLLMFactory, tmp_path: Path) -> None:
    fake = fake_vllm()
    fake.behaviour.first_token_delay = 0.05
    out = tmp_path / "partial.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "loadtest", "--base-url", fake.url, "--key", KEY, "--model", "tiny",
         "--duration", "120s", "-c", "4", "--max-tokens", "2", "--json", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert fake.wait_for(lambda: fake.completed >= 8, timeout=60), "no load arrived"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "Interrupted" in stdout and "Summary" in stdout and "Traceback" not in stderr
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True
    s = doc["targets"][0]
    assert s["requests"] >= 8 and s["ok"] == s["requests"]  # requests in flight were dropped, not failed
    assert doc["elapsed_s"] < 100

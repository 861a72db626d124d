"""Cost of the gateway's HTTP protocol guards (gateway/http/protocol.py) per request, in isolation.

Feeds the same keep-alive requests to uvicorn's plain ``HttpToolsProtocol`` and to
``GatewayHttpProtocol`` over an in-memory transport (no sockets, no gateway app: a minimal ASGI app
that reads the body and answers 200), on uvloop, alternating the two in rounds so machine noise hits
both alike, and prints the median time per request of each and the difference.

    .venv/bin/python loadtest/bench_protocol.py [--requests 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.http.limits import ServerLimits
from gateway.http.protocol import GatewayHttpProtocol

BODY = b'{"model":"bench-model","messages":[{"role":"user","content":"Hello there, how are you?"}],"max_tokens":16}'
REQUESTS = {
    "GET": b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: OpenAI/Python 1.99.0\r\n"
           b"Accept: application/json\r\nAuthorization: Bearer sk-0123456789abcdef0123456789abcdef\r\n\r\n",
    "POST": b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: OpenAI/Python 1.99.0\r\n"
            b"Accept: application/json\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer sk-0123456789abcdef0123456789abcdef\r\n"
            b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY,
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


class MemoryTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def per_request(factory: Any, request: bytes, n: int) -> float:
    transport = MemoryTransport()
    proto = factory(server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    proto.connection_made(transport)
    t0 = time.process_time()  # CPU time: less disturbed by other processes than wall time
    for _ in range(n):
        proto.data_received(request)
        cycle = proto.cycle
        while not cycle.response_complete:  # noqa: ASYNC110  # yield to the app task, nothing more
            await asyncio.sleep(0)
    elapsed = time.process_time() - t0
    assert not transport.closing and transport.written > 0
    proto.connection_lost(None)
    return elapsed / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", proxy_headers=False)
    config.load()
    factories = {
        "uvicorn HttpToolsProtocol": functools.partial(HttpToolsProtocol, config=config),
        "GatewayHttpProtocol": functools.partial(GatewayHttpProtocol, config=config, limits=ServerLimits()),
    }
    for kind, request in REQUESTS.items():
        samples: dict[str, list[float]] = {name: [] for name in factories}
        for _ in range(args.rounds):
            for name, factory in factories.items():
                samples[name].append(uvloop.run(per_request(factory, request, args.requests)))
        medians = {name: statistics.median(v) * 1e6 for name, v in samples.items()}
        base, ours = medians.values()
        print(f"{kind:4} keep-alive request: " + ", ".join(f"{n} {m:.2f} us" for n, m in medians.items())
              + f"; guard cost {ours - base:+.2f} us ({(ours / base - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()

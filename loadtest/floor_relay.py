"""The "Python floor": the least any uvicorn gateway can cost on this machine (a benchmark comparator).

Raw ASGI on uvicorn with httptools and uvloop, an aiohttp client pool, a Bearer check, one orjson parse
of the request body, the model mapped to the served name, and the answer's bytes relayed as they come
(the model name in the answer is NOT mapped back). No metrics, logs, error handling or timeouts.

Run: python loadtest/floor_relay.py --port P --upstream http://127.0.0.1:U --upstream-key K \
         --client-key C --model public=served
"""

from __future__ import annotations

import argparse
import hmac
from typing import Any

import aiohttp
import orjson
import uvicorn

HOP = {b"content-type", b"content-length"}


class Relay:
    def __init__(self, upstream: str, upstream_key: str, client_key: str, models: dict[str, str]) -> None:
        self.upstream = upstream.rstrip("/")
        self.upstream_auth = {"authorization": f"Bearer {upstream_key}", "content-type": "application/json"}
        self.client_auth = f"Bearer {client_key}".encode()
        self.models = models
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    connector = aiohttp.TCPConnector(limit=1024, ttl_dns_cache=None)
                    self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
                    await send({"type": "lifespan.startup.complete"})
                else:
                    if self.session is not None:
                        await self.session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/health":
            return await _reply(send, 200, b"")
        auth = b""
        headers = self.upstream_auth
        for k, v in scope["headers"]:
            if k == b"authorization":
                auth = v
            elif k == b"x-stub-token-delay-ms":  # the benchmark stub's pacing, passed on like the gateway does
                headers = {**headers, "x-stub-token-delay-ms": v.decode()}
        if not hmac.compare_digest(auth, self.client_auth):
            return await _reply(send, 401, b'{"error":"Unauthorized"}')
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        payload = orjson.loads(body)
        served = self.models.get(payload.get("model"))
        if served is None:
            return await _reply(send, 404, b'{"error":"model not found"}')
        payload["model"] = served
        assert self.session is not None
        async with self.session.post(self.upstream + scope["path"], data=orjson.dumps(payload),
                                     headers=headers) as resp:
            headers = [(k.lower(), v) for k, v in resp.raw_headers if k.lower() in HOP]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


async def _reply(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--upstream-key", required=True)
    p.add_argument("--client-key", required=True)
    p.add_argument("--model", action="append", required=True, help="public=served (repeatable)")
    args = p.parse_args()
    models = dict(m.split("=", 1) for m in args.model)
    app = Relay(args.upstream, args.upstream_key, args.client_key, models)
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", lifespan="on",
                access_log=False, log_level="warning", server_header=False, date_header=False)


if __name__ == "__main__":
    main()

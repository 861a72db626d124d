"""Send one request of the load and time it: latency, time to first token, output tokens, or the failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from gateway.loadtool.protocol import Answer, Api, Failure, error_failure

MAX_ERROR_BODY = 64 * 1024


@dataclass(frozen=True)
class Target:
    """One endpoint under load. `base_url` has no trailing slash and no /v1."""

    name: str
    base_url: str
    key: str
    model: str


@dataclass(frozen=True)
class RequestResult:
    target: int  # index into the run's targets
    started: float  # seconds since the run started
    latency: float  # seconds until the whole answer was read (or the failure)
    ttft: float | None  # seconds until the first generated text (streams only)
    status: int | None  # HTTP status; None when no answer arrived
    output_tokens: int | None
    error_kind: str | None = None  # None: success
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None


def normalise_base_url(url: str) -> str:
    """`http://h:8080`, `http://h:8080/`, `http://h:8080/v1` and `http://h:8080/v1/` all mean the same."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http(s) URL")
    return url


def _transport_failure(exc: httpx.HTTPError) -> Failure:
    kinds: list[tuple[type[httpx.HTTPError], str]] = [
        (httpx.ConnectTimeout, "connect_timeout"),
        (httpx.ConnectError, "connect_error"),
        (httpx.ReadTimeout, "read_timeout"),
        (httpx.RemoteProtocolError, "protocol_error"),
        (httpx.ReadError, "read_error"),
        (httpx.WriteError, "write_error"),
        (httpx.PoolTimeout, "pool_timeout"),
    ]
    kind = next((k for cls, k in kinds if isinstance(exc, cls)), type(exc).__name__)
    default = _QUIET_ERRORS.get(kind, type(exc).__name__)
    return Failure(kind, str(exc) or default)


_QUIET_ERRORS = {  # httpx raises some of these without a message
    "read_error": "the connection was reset or closed in the middle of the answer",
    "write_error": "the connection broke while sending the request",
    "read_timeout": "no data within the timeout",
}


class Sender:
    """Sends requests of one shape to one target over a shared, bounded httpx pool."""

    def __init__(self, client: httpx.AsyncClient, index: int, target: Target, api: Api, body: bytes,
                 stream: bool, timeout_s: float, clock_zero: float) -> None:  # fmt: skip
        self._client = client
        self._index = index
        self._url = target.base_url + api.path
        self._headers = api.headers(target.key)
        self._api = api
        self._body = body
        self._stream = stream
        self._timeout_s = timeout_s
        self._zero = clock_zero

    async def send(self) -> RequestResult:
        t0 = time.perf_counter()
        ttft: float | None = None
        status: int | None = None
        answer = Answer()
        try:
            async with asyncio.timeout(self._timeout_s):
                request = self._client.build_request("POST", self._url, headers=self._headers, content=self._body)
                response = await self._client.send(request, stream=True)
                try:
                    status = response.status_code
                    if status >= 300:
                        raise error_failure(status, await _read_capped(response))
                    if not self._stream:
                        answer = self._api.read_body(await response.aread())
                    else:
                        if not response.headers.get("content-type", "").startswith("text/event-stream"):
                            raise Failure("bad_stream", "a stream was asked for, the answer is "
                                          f"{response.headers.get('content-type')!r}")
                        async for event, data in _sse_events(response):
                            self._api.read_event(event, data, answer)
                            if ttft is None and answer.first_token:
                                ttft = time.perf_counter() - t0
                        if not answer.done:
                            raise Failure("incomplete_stream", "the stream ended without its final event")
                finally:
                    await response.aclose()
        except Failure as failure:
            return self._result(t0, ttft, status, answer, failure)
        except httpx.HTTPError as exc:
            return self._result(t0, ttft, status, answer, _transport_failure(exc))
        except TimeoutError:
            return self._result(t0, ttft, status, answer,
                                Failure("timeout", f"no complete answer within {self._timeout_s:g} s"))
        return self._result(t0, ttft, status, answer, None)

    def _result(self, t0: float, ttft: float | None, status: int | None, answer: Answer,
                failure: Failure | None) -> RequestResult:  # fmt: skip
        end = time.perf_counter()
        return RequestResult(
            target=self._index, started=t0 - self._zero, latency=end - t0,
            ttft=ttft if self._stream else None, status=status,
            output_tokens=answer.output_tokens if failure is None else None,
            error_kind=failure.kind if failure else None, error_message=failure.message if failure else None,
        )


async def _read_capped(response: httpx.Response) -> bytes:
    data = bytearray()
    async for part in response.aiter_bytes():
        data += part
        if len(data) >= MAX_ERROR_BODY:
            break
    return bytes(data)


async def _sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a text/event-stream, per the SSE spec (data lines joined by newlines)."""
    event = ""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
        elif line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
        elif line.startswith("event:"):
            event = line[6:].strip()
    if data:
        yield event or "message", "\n".join(data)

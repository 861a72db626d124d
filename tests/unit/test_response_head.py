"""The gateway's response start (``_Cycle``) writes exactly what uvicorn's would, byte for byte, and
ends in the same state (keep-alive, framing) or refuses the same invalid headers, for any header list
(hypothesis), including names already cached as plain by earlier responses."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.protocol import _Cycle


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.written.append(b"<closed>")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _cycle(cls: type[RequestResponseCycle], method: str, keep_alive: bool) -> tuple[RequestResponseCycle, _Transport]:
    t = _Transport()
    cycle = cls(scope={"method": method, "http_version": "1.1", "path": "/", "query_string": b""},  # type: ignore[arg-type]
                transport=t, flow=FlowControl(t), logger=logging.getLogger("t"),  # type: ignore[arg-type]
                access_logger=logging.getLogger("t.access"), access_log=False,
                default_headers=[(b"server", b"uvicorn")], message_event=asyncio.Event(),
                expect_100_continue=False, keep_alive=keep_alive, on_response=lambda: None)
    return cycle, t


def _start(cls: type[RequestResponseCycle], headers: list[tuple[bytes, bytes]], status: int, method: str,
           keep_alive: bool, bodies: list[tuple[str, bytes, bool]] = ()) -> tuple[object, ...]:  # type: ignore[assignment]
    """The start message, then ``bodies`` as (type, body, more_body) messages; what was written, the
    state after, or the first refusal."""
    async def main() -> tuple[object, ...]:
        cycle, t = _cycle(cls, method, keep_alive)
        try:
            await cycle.send({"type": "http.response.start", "status": status, "headers": headers})
            for kind, body, more in bodies:
                await cycle.send({"type": kind, "body": body, "more_body": more})  # type: ignore[misc]
        except (RuntimeError, ValueError) as exc:  # ValueError: a Content-Length that is not a number
            return ("refused", type(exc).__name__, str(exc), b"".join(t.written))  # an empty write is none
        return (b"".join(t.written), cycle.keep_alive, cycle.chunked_encoding, cycle.expected_content_length,
                cycle.response_complete)

    return asyncio.run(main())


NAMES = [b"content-type", b"Content-Length", b"content-length", b"transfer-encoding", b"Connection",
         b"connection", b"x-request-id", b"X-Ratelimit-Remaining-Requests", b"x-ratelimit-remaining-requests",
         b"bad name", b"bad:name", b"", b"retry-after"]
VALUES = [b"application/json", b"12", b"chunked", b"CHUNKED", b"close", b"keep-alive, Close", b"abc123",
          b"", b"a\r\nset-cookie: x=1", b"tab\tok", b"nul\x00", b"999999999123", b"1ms", b"gzip"]
header_lists = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=8)


@settings(max_examples=400, deadline=None)
@given(header_lists, st.sampled_from([200, 204, 304, 404]), st.sampled_from(["GET", "HEAD", "POST"]),
       st.booleans())
def test_response_start_is_uvicorns(headers: list[tuple[bytes, bytes]], status: int, method: str,
                                    keep_alive: bool) -> None:
    theirs = _start(RequestResponseCycle, headers, status, method, keep_alive)
    assert _start(_Cycle, headers, status, method, keep_alive) == theirs
    assert _start(_Cycle, headers, status, method, keep_alive) == theirs  # again, its valid names now cached


framings = st.sampled_from([[], [(b"content-length", b"0")], [(b"content-length", b"5")],
                            [(b"content-length", b"12")], [(b"transfer-encoding", b"chunked")],
                            [(b"connection", b"close")]])
bodies = st.lists(st.tuples(st.sampled_from(["http.response.body", "http.response.body", "http.response.start"]),
                            st.sampled_from([b"", b"hello", b"0123456789ab", b"x" * 300]), st.booleans()),
                  max_size=5)


@settings(max_examples=400, deadline=None)
@given(framings, st.sampled_from([200, 204]), st.sampled_from(["GET", "HEAD", "POST"]), st.booleans(), bodies)
def test_response_bodies_are_uvicorns(framing: list[tuple[bytes, bytes]], status: int, method: str, keep_alive: bool,
                                      body_msgs: list[tuple[str, bytes, bool]]) -> None:
    headers = [(b"content-type", b"text/plain"), *framing]
    assert _start(_Cycle, headers, status, method, keep_alive, body_msgs) == _start(
        RequestResponseCycle, headers, status, method, keep_alive, body_msgs)


@pytest.mark.parametrize("value", [b"1\r\nx-injected: 1", b"a\nb", b"\x00"])
def test_a_cached_name_still_has_its_value_checked(value: bytes) -> None:
    ok = _start(_Cycle, [(b"x-ratelimit-remaining-tokens", b"5")], 200, "POST", True)
    assert b"x-ratelimit-remaining-tokens: 5\r\n" in ok[0]  # type: ignore[operator]
    refused = _start(_Cycle, [(b"x-ratelimit-remaining-tokens", value)], 200, "POST", True)
    assert refused == ("refused", "RuntimeError", "Invalid HTTP header value.", b"")

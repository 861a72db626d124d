"""What the forwarder and the proxy need of an upstream's response: two implementations, one seam.

:class:`~gateway.upstream.transport.LeanResponse` (the lean transport's: status, raw headers and the
body stream, nothing built that is not asked for) and ``httpx.Response`` (an upstream behind an HTTP
proxy goes through httpx's own transport) both fit :class:`UpstreamResponse`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol


class HeaderLookup(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...


class UpstreamResponse(Protocol):
    status_code: int

    @property
    def headers(self) -> HeaderLookup: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


__all__ = ["HeaderLookup", "UpstreamResponse"]

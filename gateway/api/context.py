"""Per-request facts shared between the middleware and the handlers (stored in the ASGI scope)."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

SCOPE_KEY = "gateway.request"


@dataclass(slots=True)
class RequestContext:
    request_id: str
    started: float
    route: str
    model: str = "-"  # public model ID once resolved (a config value, safe as a label)
    upstream: str | None = None
    key_name: str | None = None
    ttfb: float | None = None
    client_gone: bool = False
    responded: bool = False  # the proxied answer's head was sent
    client_stalled: bool = False  # cut for not reading its stream (timeouts.client_stall)
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens as the backend reported them
    # Added to the response's headers by the middleware (the rate-limit headers of an admitted request)
    extra_headers: list[tuple[bytes, bytes]] | None = None


def context_of(scope: MutableMapping[str, Any]) -> RequestContext:
    ctx: RequestContext = scope[SCOPE_KEY]
    return ctx

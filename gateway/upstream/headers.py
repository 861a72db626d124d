"""Which client headers reach a backend: an allow-list, never the client's headers wholesale.

A client's headers can carry its own secrets (``x-api-key``, ``api-key``, cookies), spoofed origin
(``x-forwarded-for``, ``forwarded``), framing the gateway owns (``content-encoding``: the body is
re-serialised), or instructions vLLM acts on (``x-data-parallel-rank``). So only the names in
``forward_headers.allow`` pass (by default what vLLM reads and logs: ``user-agent``, ``accept``;
add ``traceparent``/``tracestate`` to join the client's traces), each at most once, and the
gateway sets its own (``content-type``, ``authorization`` with the backend's key, ``x-request-id``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# anthropic-version / anthropic-beta: vLLM's /v1/messages reads them (Anthropic clients always send them).
DEFAULT_ALLOW = ("user-agent", "accept", "anthropic-version", "anthropic-beta")

# Headers the gateway owns or that describe the client's own connection or body: never forwarded,
# whatever the config says (the config refuses them too).
NEVER_FORWARDED = frozenset({
    "host", "content-length", "content-type", "content-encoding", "transfer-encoding", "authorization",
    "proxy-authorization", "x-api-key", "api-key", "cookie", "connection", "keep-alive", "te", "trailer",
    "upgrade", "expect", "x-request-id", "accept-encoding", "x-forwarded-for", "x-forwarded-host",
    "x-forwarded-proto", "forwarded", "x-real-ip", "x-data-parallel-rank", "proxy-connection",
})

MAX_VALUE_BYTES = 1024  # a forwarded header value longer than this is dropped


def allow_set(names: Iterable[str]) -> frozenset[bytes]:
    return frozenset(n.lower().encode("latin-1") for n in names)


def forward_headers(
    client_headers: Sequence[tuple[bytes, bytes]], allow: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """The allowed client headers (ASGI names are lower-case), the first of each name only, minus
    any the client's ``Connection`` header lists (hop-by-hop, RFC 9110 7.6.1)."""
    skip: set[bytes] = set()
    for k, v in client_headers:
        if k == b"connection":
            skip.update(t.strip().lower() for t in v.split(b","))
    out: list[tuple[bytes, bytes]] = []
    for k, v in client_headers:
        if k in allow and k not in skip and len(v) <= MAX_VALUE_BYTES:
            skip.add(k)
            out.append((k, v))
    return out

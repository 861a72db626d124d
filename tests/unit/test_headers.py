"""The client-header allow-list (gateway.upstream.headers)."""

from __future__ import annotations

from gateway.upstream.headers import DEFAULT_ALLOW, MAX_VALUE_BYTES, allow_set, forward_headers

ALLOW = allow_set(DEFAULT_ALLOW)


def test_only_allowed_names_once_each() -> None:
    sent = [(b"user-agent", b"a"), (b"x-api-key", b"secret"), (b"user-agent", b"b"), (b"accept", b"*/*"),
            (b"x-forwarded-for", b"1.2.3.4"), (b"x-data-parallel-rank", b"1"), (b"content-encoding", b"gzip")]
    assert forward_headers(sent, ALLOW) == [(b"user-agent", b"a"), (b"accept", b"*/*")]


def test_connection_listed_names_are_hop_by_hop_even_when_allowed() -> None:
    sent = [(b"accept", b"*/*"), (b"connection", b"keep-alive, Accept"), (b"user-agent", b"u")]
    assert forward_headers(sent, ALLOW) == [(b"user-agent", b"u")]


def test_oversized_values_are_dropped() -> None:
    assert forward_headers([(b"user-agent", b"x" * (MAX_VALUE_BYTES + 1))], ALLOW) == []

"""Request bodies sent with ``Content-Encoding``: decoded (gzip, deflate) under the same size limit
as a plain body, or refused with 415 (any other coding). The gateway re-serialises every body, so
the coding is never passed on to a backend."""

from __future__ import annotations

import zlib

from gateway.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decode_body(body: bytes, coding: str, limit: int) -> bytes:
    """``body`` decoded per its Content-Encoding value; at most ``limit`` bytes once decoded."""
    codings = [c.strip().lower() for c in coding.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return body
    if len(codings) > 1 or codings[0] not in _WBITS:
        raise UnsupportedMediaType(
            f"Unsupported Content-Encoding {coding.strip()[:64]!r}: send the body uncompressed, or "
            f"compressed with gzip or deflate."
        )
    name = codings[0]
    attempts = [_WBITS[name], -zlib.MAX_WBITS] if name == "deflate" else [_WBITS[name]]  # zlib or raw deflate
    for wbits in attempts:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or d.unconsumed_tail:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes once decompressed.")
        if not d.eof:
            raise InvalidRequest(f"The {name}-compressed request body is truncated.", code="invalid_body")
        return out
    raise InvalidRequest(f"The request body is not valid {name} data.", code="invalid_body")

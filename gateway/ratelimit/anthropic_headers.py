"""The limiter's ``x-ratelimit-*`` headers in Anthropic's terms, for the ``/v1/messages`` routes.

``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` become
``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``; a reset, a duration in OpenAI's
format (``20ms``, ``1.2s``, ``6m0s``), becomes the RFC 3339 time at which the bucket is full again.
Every other header passes unchanged.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime

Header = tuple[bytes, bytes]

_PREFIX = b"x-ratelimit-"
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+)ms)?$")


def duration_ms(text: str) -> float:
    """``1h2m3.5s`` / ``6m0s`` / ``1.2s`` / ``20ms`` -> milliseconds (0 for anything else)."""
    m = _DURATION.match(text.strip())
    if m is None:
        return 0.0
    h, mins, secs, ms = m.groups()
    return (int(h or 0) * 3600 + int(mins or 0) * 60 + float(secs or 0)) * 1000 + int(ms or 0)


def rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def to_anthropic(headers: Iterable[Header], now: float | None = None) -> list[Header]:
    at = time.time() if now is None else now
    out: list[Header] = []
    for name, value in headers:
        if not name.startswith(_PREFIX):
            out.append((name, value))
            continue
        what, _, kind = name[len(_PREFIX):].partition(b"-")  # b"reset", b"requests"
        if what == b"reset":
            value = rfc3339(at + duration_ms(value.decode("latin-1")) / 1000).encode()
        out.append((b"anthropic-ratelimit-" + kind + b"-" + what, value))
    return out

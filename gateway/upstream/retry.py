"""The retry policy, pure: which failed attempt may be tried again, what it says about the backend,
and how long to wait first.

An attempt fails before any byte reached the client (the forwarder never retries later). Then:

- **retry** (another attempt, on a different usable upstream when there is one, else the same one):
  connect errors (refused, connect timeout), a reset or close before the response head, and a
  backend's 502, 503, 504 or 429;
- **fail over only** (another upstream, never the same one again): what is wrong with that one
  backend and not with the request: its other 5xx (vLLM's 500 "engine dead"), a wrong key, a wrong
  served name, an endpoint it does not serve (today's fail-over rule, kept);
- **never**: a timeout once the request was sent (a slow generation must not run twice), the
  backend's 4xx for the request itself, a malformed answer, and the gateway's own faults.

The backoff before retry ``n`` (1 for the first retry) is full jitter,
``uniform(0, backoff_ms * 2**(n-1))``, and never runs past the request's deadline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gateway.errors import GatewayError, UpstreamRejected

# Codes of errors raised before the response head (see gateway.upstream.normalize).
_CONNECT = frozenset({"upstream_unavailable", "upstream_connect_timeout"})
_RETRY_STATUS = frozenset({429, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: str | None  # the metric label when another attempt may follow; None: stop here
    same_upstream_ok: bool  # the same upstream may take the next attempt (no other one left)
    backend_failure: bool  # counts against the upstream's circuit breaker


STOP = Verdict(None, False, False)


def judge(err: GatewayError, backend_status: int | None, sent_timeout: bool = False) -> Verdict:
    """``backend_status``: the status the backend answered (None when it sent no response head);
    ``sent_timeout``: no response head within the first-byte limit after the request was sent."""
    if sent_timeout:
        return Verdict(None, False, True)  # a breaker signal, never a retry
    if backend_status is None:
        if err.code in _CONNECT:
            return Verdict("connect", True, True)
        if err.code == "upstream_disconnected":
            return Verdict("reset", True, True)
        return Verdict("transport", False, True) if err.retryable else Verdict(None, False, err.status >= 500)
    if backend_status in _RETRY_STATUS:
        return Verdict(f"http_{backend_status}", True, backend_status >= 500)
    if backend_status >= 500:
        return Verdict(f"http_{backend_status}", False, True) if err.retryable else Verdict(None, False, True)
    if err.retryable and not isinstance(err, UpstreamRejected):  # wrong key, wrong name, endpoint not served
        return Verdict(f"http_{backend_status}", False, False)
    return STOP


def backoff_s(retry: int, backoff_ms: int, remaining_s: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``retry`` (1-based): full jitter over an exponential cap,
    at most ``remaining_s`` (the time left before the request's deadline)."""
    if backoff_ms <= 0 or remaining_s <= 0:
        return 0.0
    cap = backoff_ms / 1000 * (2 ** (retry - 1))
    r: float = rng.random() if rng is not None else random.random()
    return float(min(cap * r, remaining_s))


__all__ = ["STOP", "Verdict", "backoff_s", "judge"]

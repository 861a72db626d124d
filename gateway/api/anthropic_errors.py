"""Anthropic's error envelope for the gateway's one error tree (``gateway.errors``).

The same :class:`~gateway.errors.GatewayError` that the OpenAI routes render as
``{"error": {"message", "type", "param", "code"}}`` is rendered on the Anthropic routes as
``{"type": "error", "error": {"type", "message"}, "request_id"}``: the status stays the gateway's,
only the envelope and the error type differ.

    status  Anthropic type           the anthropic SDK raises   from
    400     invalid_request_error    BadRequestError            bad JSON, missing field, vLLM's validation
    401     authentication_error     AuthenticationError        missing or unknown key
    403     permission_error         PermissionDeniedError      (an upstream 403 is a gateway config error: 502)
    404     not_found_error          NotFoundError              unknown model or one the key may not use; path
    405     invalid_request_error    APIStatusError             wrong method
    413     request_too_large        ContentTooLargeError       body over limits.max_body_bytes
    429     rate_limit_error         RateLimitError             the backend's (or, later, the gateway's) limit
    500     api_error                InternalServerError        the gateway failed
    502     api_error                InternalServerError        backend 5xx, HTML, wrong key, wrong served name
    503     overloaded_error         ServiceUnavailableError    no backend reachable
    504     timeout_error            GatewayTimeoutError        backend timed out

vLLM itself answers this route with Anthropic-shaped bodies whose types are its exception class
names (``BadRequestError``, ``NotFoundError``) or ``internal_error``, and with OpenAI-shaped bodies
for request validation; :func:`anthropic_type_of` maps any of those names onto Anthropic's set.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.ratelimit.anthropic_headers import to_anthropic

_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

ANTHROPIC_TYPES = frozenset({*_BY_STATUS.values(), "invalid_request_error", "api_error"})

# Names vLLM (or an OpenAI-style backend) puts in `type`, mapped onto Anthropic's.
_FOREIGN = {
    "internal_error": "api_error",
    "internalservererror": "api_error",
    "server_error": "api_error",
    "badrequesterror": "invalid_request_error",
    "bad request": "invalid_request_error",
    "notfounderror": "not_found_error",
    "authenticationerror": "authentication_error",
    "permissiondeniederror": "permission_error",
    "ratelimiterror": "rate_limit_error",
    "rate_limit_exceeded": "rate_limit_error",
    "overloaded": "overloaded_error",
}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    found = _BY_STATUS.get(status)
    if found is not None:
        return found
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_type_of(name: str | None, status: int = 500) -> str:
    """Map a foreign error type name (vLLM's, OpenAI's) onto Anthropic's set."""
    if name:
        if name in ANTHROPIC_TYPES:
            return name
        mapped = _FOREIGN.get(name.lower())
        if mapped is not None:
            return mapped
    return anthropic_type(status)


def body(err: GatewayError, request_id: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "error", "error": {"type": anthropic_type(err.status), "message": err.message}}
    if request_id:
        out["request_id"] = request_id
    return out


def body_bytes(err: GatewayError, request_id: str | None = None) -> bytes:
    return orjson.dumps(body(err, request_id))


def headers(err: GatewayError, request_id: str | None) -> list[tuple[bytes, bytes]]:
    h = [(b"content-type", b"application/json")]
    if request_id:
        h.append((b"request-id", request_id.encode()))
    own = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    h.extend(to_anthropic([*own, *err.policy_headers()]))
    return h


def error_event(data: bytes) -> bytes:
    """One SSE ``error`` event: the anthropic SDK raises ``APIStatusError`` on it."""
    return b"event: error\ndata: " + data + b"\n\n"


def normalize_error_event(event: bytes, request_id: str | None = None) -> bytes:
    """An upstream ``error`` event with its type mapped onto Anthropic's set, message kept."""
    data = b""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data += line[5:].strip()
    message = "The backend reported an error in the middle of the stream."
    typ: str | None = None
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        e = parsed["error"]
        if isinstance(e.get("message"), str) and e["message"]:
            message = e["message"]
        typ = e.get("type") if isinstance(e.get("type"), str) else None
    out: dict[str, Any] = {"type": "error", "error": {"type": anthropic_type_of(typ), "message": message}}
    if request_id:
        out["request_id"] = request_id
    return error_event(orjson.dumps(out))


__all__ = [
    "ANTHROPIC_TYPES", "anthropic_type", "anthropic_type_of", "body", "body_bytes", "error_event", "headers",
    "normalize_error_event",
]

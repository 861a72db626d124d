"""Map what an upstream did into the gateway's errors, in one place.

- :func:`from_transport_error`: httpx exceptions -> GatewayError (503 unreachable, 504 timeout).
- :func:`from_error_response`: an upstream error response (status + body) -> GatewayError, keeping
  vLLM's message for the client's own mistakes and explaining operator mistakes (wrong key, wrong
  served name) without leaking secrets.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson

from gateway.domain import Upstream
from gateway.errors import (
    EndpointNotSupported,
    GatewayError,
    OutOfFileDescriptors,
    UpstreamAuthFailed,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamModelMissing,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
    is_fd_exhaustion,
)

_CONTEXT = re.compile(r"maximum context length|context length is|prompt is too long", re.I)


def from_transport_error(exc: httpx.HTTPError, upstream: Upstream) -> GatewayError:
    name = upstream.name
    if isinstance(exc, httpx.ConnectError) and is_fd_exhaustion(exc):
        return OutOfFileDescriptors(
            f"The gateway has no file descriptor left to connect to upstream {name} "
            "(EMFILE/ENFILE: too many open connections here); the upstream was not contacted.")
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        err: GatewayError = UpstreamUnavailable(
            f"Upstream {name} did not accept a connection in time.", code="upstream_connect_timeout"
        )
        return err
    if isinstance(exc, httpx.ConnectError):
        return UpstreamUnavailable(f"Upstream {name} is unreachable (connection refused or no route).")
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"Upstream {name} timed out.")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return UpstreamError(
            f"Upstream {name} closed the connection unexpectedly.", code="upstream_disconnected"
        )
    return UpstreamError(f"Upstream {name} failed: {type(exc).__name__}.")


def _parse(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _error_fields(data: Any) -> tuple[str | None, str | None, str | None]:
    """(message, type, param) from vLLM/OpenAI/FastAPI error bodies."""
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            msg = err.get("message")
            typ = err.get("type")
            param = err.get("param")
            return (
                str(msg) if msg is not None else None,
                str(typ) if typ is not None else None,
                str(param) if param is not None else None,
            )
        if isinstance(err, str):
            return err, None, None
        detail = data.get("detail")
        if isinstance(detail, str):
            return detail, None, None
        if isinstance(data.get("message"), str):
            return str(data["message"]), None, None
    return None, None, None


def _client_param(param: str | None) -> str | None:
    # vLLM reports pydantic locations ("body.messages", "body.28"); clients know field names.
    if param is None:
        return None
    if param == "body":
        return None
    if param.startswith("body."):
        rest = param[len("body."):]
        return None if rest.isdigit() else rest
    return param


def from_error_response(status: int, body: bytes, upstream: Upstream, path: str) -> GatewayError:
    name = upstream.name
    data = _parse(body)
    message, _typ, param = _error_fields(data)
    if status in (401, 403):
        return UpstreamAuthFailed(
            f"Upstream {name} rejected the gateway's credentials ({status}): the backend's --api-key "
            f"does not match the api_key configured for upstream {name}. This is a gateway "
            f"configuration error; the operator has been alerted in the logs."
        )
    if status == 404:
        if (message is not None and "does not exist" in message) or param == "model":
            # The backend's served names stay in the operator's log: clients learn only that it is
            # a configuration error.
            return UpstreamModelMissing(
                f"Upstream {name} does not serve the model name configured for it. This is a gateway "
                f"configuration error; the operator has been alerted in the logs.",
                detail=f"Upstream {name} does not serve the model name {upstream.served_name!r} "
                f"(backend said: {message}). Set this upstream's `model` to the backend's "
                f"--served-model-name.",
            )
        return EndpointNotSupported(
            f"The model `{upstream.model_id}` does not support {path}: its backend does not serve this "
            f"endpoint. Use a model of the right kind for {path}.",
            param="model",
            detail=f"Upstream {name} answered 404 to {path}: it does not serve this endpoint.",
        )
    if status == 405:
        return UpstreamBadResponse(f"Upstream {name} does not allow POST {path} (405).")
    if status >= 500:
        detail = f" (backend said: {message})" if message else ""
        if status == 503:
            return UpstreamUnavailable(f"Upstream {name} is unavailable (503){detail}.")
        return UpstreamError(f"Upstream {name} failed with {status}{detail}.", code="upstream_error")
    if 400 <= status < 500:
        if message is None:
            text = body[:300].decode("utf-8", "replace").strip()
            message = f"Upstream {name} rejected the request ({status}): {text or 'empty body'}"
        code = "context_length_exceeded" if _CONTEXT.search(message) else None
        if status == 429:
            return UpstreamRejected(message, status=429, type="rate_limit_error", code="rate_limit_exceeded")
        return UpstreamRejected(message, status=status, param=_client_param(param), code=code)
    return UpstreamBadResponse(f"Upstream {name} answered an unexpected status {status}.")


def check_success_body(body: bytes, kind: str, upstream: Upstream) -> dict[str, Any]:
    """Parse a 2xx JSON body and check it has what the endpoint promises."""
    data = _parse(body)
    if not isinstance(data, dict):
        snippet = body[:80].decode("utf-8", "replace")
        raise UpstreamBadResponse(
            f"Upstream {upstream.name} answered 200 with a body that is not a JSON object: {snippet!r}"
        )
    required = {"chat": "choices", "completions": "choices", "embeddings": "data", "responses": "output"}[kind]
    if not isinstance(data.get(required), list):
        if "error" in data:
            message, _t, _p = _error_fields(data)
            raise UpstreamError(f"Upstream {upstream.name} reported an error: {message}")
        raise UpstreamBadResponse(
            f"Upstream {upstream.name} answered 200 without `{required}`; refusing to pass on a "
            f"malformed completion."
        )
    return data

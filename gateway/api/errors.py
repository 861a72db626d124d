"""The single place where errors become HTTP responses, always in OpenAI's error format."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from gateway.api.routes import suggest
from gateway.errors import GatewayError, InternalError, InvalidRequest, MethodNotAllowed, RouteNotFound

log = logging.getLogger("gateway.api")

Send = Any


def error_headers(err: GatewayError, request_id: str | None) -> list[tuple[bytes, bytes]]:
    h = [(b"content-type", b"application/json")]
    if request_id:
        h.append((b"x-request-id", request_id.encode()))
    for k, v in err.headers.items():
        h.append((k.lower().encode(), v.encode()))
    h.extend(err.policy_headers())
    return h


async def send_error(send: Send, err: GatewayError, request_id: str | None = None) -> None:
    body = err.body_bytes()
    headers = [*error_headers(err, request_id), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def error_response(err: GatewayError) -> Response:
    response = Response(err.body_bytes(), status_code=err.status, media_type="application/json",
                        headers=err.headers or None)
    response.raw_headers.extend(err.policy_headers())
    return response


def http_exception_to_error(request: Request, exc: StarletteHTTPException) -> GatewayError:
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        hint = suggest(path)
        tip = f" Did you mean {hint}?" if hint else ""
        return RouteNotFound(
            f"Unknown path {method} {path}.{tip} The OpenAI-compatible endpoints are "
            f"/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and /v1/models; "
            f"set your client's base_url to http(s)://<gateway host>/v1."
        )
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow") or ""
        return MethodNotAllowed(
            f"Method {method} is not allowed on {path}." + (f" Use {allow}." if allow else ""),
            headers={"allow": allow} if allow else None,
        )
    return GatewayError(str(exc.detail), status=exc.status_code,
                        type="invalid_request_error" if exc.status_code < 500 else "server_error",
                        code=None)


def install_exception_handlers(app: FastAPI) -> None:
    async def on_gateway_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def on_http_exception(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(http_exception_to_error(request, exc))

    async def on_validation(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        return error_response(InvalidRequest(
            f"Invalid request: {first.get('msg', 'validation failed')}" + (f" (at {param})" if param else ""),
            param=param, code="invalid_value",
        ))

    async def on_unexpected(_request: Request, _exc: Exception) -> Response:
        # Starlette re-raises after this response; RequestContextMiddleware logs it once.
        return error_response(InternalError("The gateway failed to handle this request."))

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(StarletteHTTPException, on_http_exception)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(Exception, on_unexpected)

"""The Anthropic API's non-proxied parts: the root probe, the model list in Anthropic's format, and
Anthropic-shaped answers for wrong methods and unknown ``/v1/messages/...`` paths.

(``POST /v1/messages`` and ``/v1/messages/count_tokens`` are proxied: ``gateway.api.proxy`` with
the Anthropic dialect, ``gateway.api.anthropic``.)
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api import anthropic_errors
from gateway.api.anthropic import AnthropicDialect
from gateway.api.routes import PROXY_ROUTES
from gateway.domain import ModelEntry
from gateway.errors import GatewayError, MethodNotAllowed, RouteNotFound
from gateway.services import Services

_DIALECT = AnthropicDialect()
_POST_ONLY = tuple(p for p, r in PROXY_ROUTES.items() if r.dialect == "anthropic")


def wants_anthropic(request: Request) -> bool:
    """Anthropic clients send ``anthropic-version`` on every request."""
    return "anthropic-version" in request.headers


def error_response(err: GatewayError, request_id: str | None) -> Response:
    return Response(anthropic_errors.body_bytes(err, request_id), status_code=err.status,
                    headers={k.decode(): v.decode() for k, v in anthropic_errors.headers(err, request_id)})


def _request_id(request: Request) -> str | None:
    ctx = request.scope.get("gateway.request")
    return getattr(ctx, "request_id", None)


def _model_obj(e: ModelEntry, shown_id: str | None = None) -> dict[str, object]:
    created = datetime.fromtimestamp(e.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": shown_id or e.id, "display_name": shown_id or e.id, "created_at": created}


def _json(body: object, request_id: str | None) -> Response:
    headers = {"request-id": request_id} if request_id else None
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


def list_models(s: Services, request: Request) -> Response:
    """``GET /v1/models`` for an Anthropic client: public IDs only (aliases are not listed)."""
    rid = _request_id(request)
    try:
        principal = s.keys.authenticate(_DIALECT.credentials(list(request.scope["headers"])))
    except GatewayError as err:
        return error_response(err, rid)
    data = [_model_obj(e) for e in s.table.visible_to(principal)]
    return _json({"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                  "last_id": data[-1]["id"] if data else None}, rid)


def get_model(s: Services, model_id: str, request: Request) -> Response:
    rid = _request_id(request)
    try:
        principal = s.keys.authenticate(_DIALECT.credentials(list(request.scope["headers"])))
        entry = s.table.resolve(model_id, principal)
    except GatewayError as err:
        return error_response(err, rid)
    return _json(_model_obj(entry, model_id), rid)


def build_router(s: Services) -> APIRouter:
    router = APIRouter()

    async def root(request: Request) -> Response:
        # Claude Code sends `HEAD /` as a connectivity check before its first request: answer at
        # once, without a key, revealing nothing but that this is the gateway.
        return _json({"service": "vllm-gateway", "status": "ok"}, _request_id(request))

    router.routes.append(Route("/", root, methods=["GET", "HEAD"], include_in_schema=False))

    async def wrong_method(request: Request) -> Response:
        return error_response(
            MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}. Use POST.",
                             headers={"allow": "POST"}),
            _request_id(request),
        )

    for path in _POST_ONLY:
        router.routes.append(Route(path, wrong_method, methods=["GET", "PUT", "PATCH", "DELETE"],
                                   include_in_schema=False))

    async def unknown(request: Request) -> Response:
        path = request.url.path
        err: GatewayError = RouteNotFound(
            f"Unknown path {request.method} {path}. The Anthropic endpoints this gateway serves are "
            f"POST /v1/messages, POST /v1/messages/count_tokens and GET /v1/models; set the client's "
            f"base URL (ANTHROPIC_BASE_URL) to http(s)://<gateway host>, without /v1."
        )
        if path.startswith("/v1/messages/batches"):
            err = RouteNotFound("Message batches are not supported by this gateway (vLLM does not serve them).")
        return error_response(err, _request_id(request))

    router.routes.append(Route("/v1/messages/{rest:path}", unknown,
                               methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False))
    return router


__all__ = ["build_router", "error_response", "get_model", "list_models", "wants_anthropic"]

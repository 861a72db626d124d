"""``/v1/models`` and the proxied endpoints, wired onto a FastAPI router."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.routing import Route

from gateway.api.proxy import ProxyEndpoint
from gateway.api.routes import PROXY_ROUTES
from gateway.domain import ModelEntry
from gateway.services import Services


def _model_obj(e: ModelEntry) -> dict[str, object]:
    return {"id": e.id, "object": "model", "created": e.created, "owned_by": e.owned_by}


def build_router(s: Services) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models(request: Request) -> dict[str, object]:
        principal = s.keys.authenticate(request.headers.get("authorization"))
        return {"object": "list", "data": [_model_obj(e) for e in s.table.visible_to(principal)]}

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict[str, object]:
        principal = s.keys.authenticate(request.headers.get("authorization"))
        return _model_obj(s.table.resolve(model_id, principal))

    for path, route in PROXY_ROUTES.items():
        router.routes.append(Route(path, ProxyEndpoint(route, s), methods=["POST"]))
    return router


__all__ = ["build_router"]

"""``/v1/models`` and the proxied endpoints, wired onto a FastAPI router."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api import anthropic_routes
from gateway.api.proxy import ProxyEndpoint
from gateway.api.routes import PROXY_ROUTES
from gateway.domain import ModelEntry
from gateway.routing.health import HealthBoard
from gateway.services import Services


def _model_obj(e: ModelEntry, board: HealthBoard) -> dict[str, object]:
    """The public model card, with the useful fields of its backends' cards (never their local paths)."""
    card: dict[str, object] = {"id": e.id, "object": "model", "created": e.created, "owned_by": e.owned_by}
    lens = [n for u in e.upstreams if (n := board.max_model_len(u.name)) is not None]
    if lens:
        card["max_model_len"] = min(lens)  # a request may reach any of them
    return card


def build_router(s: Services) -> APIRouter:
    router = APIRouter()

    @router.api_route("/v1/models", methods=["GET", "HEAD"], response_model=None)
    async def list_models(request: Request) -> dict[str, object] | Response:
        if anthropic_routes.wants_anthropic(request):
            return anthropic_routes.list_models(s, request)
        principal = s.keys.authenticate(request.headers.get("authorization"))
        return {"object": "list", "data": [_model_obj(e, s.board) for e in s.table.visible_to(principal)]}

    @router.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"], response_model=None)
    async def get_model(model_id: str, request: Request) -> dict[str, object] | Response:
        if anthropic_routes.wants_anthropic(request):
            return anthropic_routes.get_model(s, model_id, request)
        principal = s.keys.authenticate(request.headers.get("authorization"))
        return {**_model_obj(s.table.resolve(model_id, principal), s.board), "id": model_id}  # an alias stays as sent

    for path, route in PROXY_ROUTES.items():
        router.routes.append(Route(path, ProxyEndpoint(route, s), methods=["POST"]))
    return router


__all__ = ["build_router"]

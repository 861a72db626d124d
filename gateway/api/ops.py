"""Operations endpoints: liveness, readiness (per model and backend, never a key), metrics."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from starlette.responses import Response

from gateway.routing.probe import ProbeState
from gateway.services import Services


def build_router(s: Services) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/health/ready")
    async def ready() -> Response:
        models = []
        all_ready = True
        for entry in s.table.entries.values():
            ups = []
            any_ok = False
            for u in entry.upstreams:
                r = s.board.get(u.name)
                ok = r.ok or (not s.config.health.enabled and r.state is ProbeState.UNKNOWN)
                any_ok = any_ok or ok
                ups.append({"name": u.name, "state": r.state.value, "detail": r.detail})
            all_ready = all_ready and any_ok
            models.append({"id": entry.id, "ready": any_ok, "upstreams": ups})
        body = {"status": "ready" if all_ready else "not_ready", "models": models}
        return Response(orjson.dumps(body), status_code=200 if all_ready else 503,
                        media_type="application/json")

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(s.metrics.render(), media_type=s.metrics.content_type)

    return router

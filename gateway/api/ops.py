"""Operations endpoints: liveness, readiness (of the gateway; model and backend states beside it), metrics."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from starlette.responses import Response

from gateway.routing.breaker import CircuitState
from gateway.routing.probe import ProbeState
from gateway.services import Services


def build_router(s: Services) -> APIRouter:
    router = APIRouter()

    @router.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.api_route("/health/ready", methods=["GET", "HEAD"])
    async def ready() -> Response:
        # States only: no URLs, ports, error text or served names (those go to the log). 200 while
        # the gateway itself can serve, whatever its backends do (see gateway.lifecycle).
        models = []
        breakers = s.board.breakers
        for entry in s.table.entries.values():
            ups = []
            any_ok = False
            for u in entry.upstreams:
                r = s.board.get(u.name)
                unprobed = not s.config.health.enabled or u.spec.probe_mode == "passive"
                circuit = breakers.state(u.name) if breakers is not None else CircuitState.CLOSED
                ok = (r.ok or (unprobed and r.state is ProbeState.UNKNOWN)) and circuit is not CircuitState.OPEN
                any_ok = any_ok or ok
                ups.append({"name": u.name, "state": r.state.value, "circuit": circuit.value})
            models.append({"id": entry.id, "ready": any_ok, "upstreams": ups})
        life = s.lifecycle
        body = {"status": life.state, "models_ready": sum(1 for m in models if m["ready"]),
                "models": models}
        return Response(orjson.dumps(body), status_code=200 if life.ready else 503,
                        media_type="application/json")

    @router.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> Response:
        return Response(s.metrics.render(), media_type=s.metrics.content_type)

    return router

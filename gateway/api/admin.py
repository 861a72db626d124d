"""The admin API under /admin (docs/admin.md): thin routes over :class:`gateway.admin.service.AdminService`.

Every route authenticates an admin key first (401 without, 403 with a client key); with no admin key
configured the whole API answers 404, as an unknown path would.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway import __version__
from gateway.admin.service import AdminService
from gateway.api.routes import suggest
from gateway.auth.admin import AdminKeys
from gateway.errors import InvalidRequest, RouteNotFound
from gateway.routing.load import Scrape
from gateway.routing.probe import ProbeState
from gateway.services import Services

MAX_ADMIN_BODY = 1 << 20


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})


def _list(items: list[Any], **extra: Any) -> Response:
    return _json({"object": "list", **extra, "data": items})


def _if_match(request: Request) -> int | None:
    raw = request.headers.get("if-match")
    if raw is None:
        return None
    v = raw.strip().removeprefix("W/").strip('"')
    if not v.isdigit():
        raise InvalidRequest(f"If-Match must be a version number (as in the object's `version`), not {raw!r}.",
                             param="If-Match", code="invalid_value")
    return int(v)


def _verify(request: Request) -> bool:
    return request.query_params.get("verify", "").lower() in ("1", "true", "yes")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_ADMIN_BODY:
        raise InvalidRequest("The body is over 1 MiB.", code="request_too_large")
    try:
        data = orjson.loads(raw or b"null")
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The body must be a JSON object.", code="invalid_json")
    return data


_STATES = {ProbeState.OK: "up", ProbeState.UNKNOWN: "unknown"}


def _scrape(scrape: Scrape | None) -> dict[str, float] | None:
    """The backend's last fresh vLLM /metrics reading (load routing), or None (not scraped, or stale)."""
    if scrape is None:
        return None
    return {"running": scrape.running, "waiting": scrape.waiting, "kv_cache_usage": scrape.kv_usage}


def build_router(s: Services, admin: AdminService | None, keys: AdminKeys) -> APIRouter:
    router = APIRouter(prefix="/admin")

    def auth(request: Request) -> tuple[AdminService, str]:
        keys.refresh(s.config.admin.keys)  # a reload may have changed them
        if admin is None or not keys.enabled:
            hint = suggest(request.url.path)
            raise RouteNotFound(f"Unknown path {request.method} {request.url.path}."
                                + (f" Did you mean {hint}?" if hint else ""))
        return admin, keys.authenticate(request.headers.get("authorization"), s.keys)

    @router.get("/models")
    async def list_models(request: Request) -> Response:
        a, _ = auth(request)
        return _list(a.models())

    @router.post("/models")
    async def create_model(request: Request) -> Response:
        a, who = auth(request)
        return _json(await a.create_model(who, await _body(request), _verify(request)), 201)

    @router.get("/models/{model_id:path}/upstreams/{name}")
    async def get_upstream(request: Request, model_id: str, name: str) -> Response:
        a, _ = auth(request)
        for u in a.model(model_id)["upstreams"]:
            if u.get("name") == name:
                return _json(u)
        raise RouteNotFound(f"Model {model_id!r} has no upstream named {name!r}.", code="not_found")

    @router.post("/models/{model_id:path}/upstreams")
    async def add_upstream(request: Request, model_id: str) -> Response:
        a, who = auth(request)
        return _json(await a.add_upstream(who, model_id, await _body(request), _if_match(request),
                                          _verify(request)), 201)

    @router.patch("/models/{model_id:path}/upstreams/{name}")
    async def patch_upstream(request: Request, model_id: str, name: str) -> Response:
        a, who = auth(request)
        return _json(await a.patch_upstream(who, model_id, name, await _body(request), _if_match(request),
                                            _verify(request)))

    @router.delete("/models/{model_id:path}/upstreams/{name}")
    async def delete_upstream(request: Request, model_id: str, name: str) -> Response:
        a, who = auth(request)
        return _json(await a.delete_upstream(who, model_id, name, _if_match(request)))

    @router.get("/models/{model_id:path}")
    async def get_model(request: Request, model_id: str) -> Response:
        a, _ = auth(request)
        return _json(a.model(model_id))

    @router.put("/models/{model_id:path}")
    async def put_model(request: Request, model_id: str) -> Response:
        a, who = auth(request)
        return _json(await a.replace_model(who, model_id, await _body(request), _if_match(request),
                                           _verify(request)))

    @router.patch("/models/{model_id:path}")
    async def patch_model(request: Request, model_id: str) -> Response:
        a, who = auth(request)
        return _json(await a.patch_model(who, model_id, await _body(request), _if_match(request),
                                         _verify(request)))

    @router.delete("/models/{model_id:path}")
    async def delete_model(request: Request, model_id: str) -> Response:
        a, who = auth(request)
        return _json(await a.delete_model(who, model_id, _if_match(request)))

    @router.get("/keys")
    async def list_keys(request: Request) -> Response:
        a, _ = auth(request)
        return _list(a.keys())

    @router.post("/keys")
    async def create_key(request: Request) -> Response:
        a, who = auth(request)
        return _json(await a.create_key(who, await _body(request)), 201)

    @router.patch("/keys/{name}")
    async def patch_key(request: Request, name: str) -> Response:
        a, who = auth(request)
        return _json(await a.patch_key(who, name, await _body(request), _if_match(request)))

    @router.delete("/keys/{name}")
    async def delete_key(request: Request, name: str) -> Response:
        a, who = auth(request)
        return _json(await a.delete_key(who, name, _if_match(request)))

    @router.get("/backends")
    async def backends(request: Request) -> Response:
        auth(request)
        out = []
        breakers = s.board.breakers
        for entry in s.table.entries.values():
            for u in entry.upstreams:
                r = s.board.get(u.name)
                out.append({"name": u.name, "model": entry.id, "url": u.base_url,
                            "state": _STATES.get(r.state, "down"), "reason": r.detail,
                            "in_flight": s.load.in_flight(u.name), "last_probe": s.board.last_probe(u.name),
                            "weight": u.weight, "kind": u.spec.kind,
                            "circuit": breakers.state(u.name).value if breakers is not None else "closed",
                            "scrape": _scrape(s.load.fresh(u.name))})
        return _list(out)

    @router.get("/usage")
    async def usage(request: Request) -> Response:
        auth(request)
        raw = request.query_params.get("days", "7")
        if not raw.isdigit() or not 1 <= int(raw) <= 366:
            raise InvalidRequest("days must be a whole number from 1 to 366.", param="days", code="invalid_value")
        days = int(raw)
        rows = await s.usage_reader.usage(days)
        data = [{"day": r.day, "key": r.key, "model": r.model, "requests": r.requests,
                 "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                 "total_tokens": r.prompt_tokens + r.completion_tokens, "rate_limited": r.rate_limited}
                for r in rows]
        return _list(data, days=days)

    @router.get("/audit")
    async def audit(request: Request) -> Response:
        a, _ = auth(request)
        raw = request.query_params.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= 1000:
            raise InvalidRequest("limit must be a whole number from 1 to 1000.", param="limit",
                                 code="invalid_value")
        return _list(await a.audit(int(raw)))

    @router.get("/status")
    async def status(request: Request) -> Response:
        a, _ = auth(request)
        return _json({"instance_id": a.instance_id, "version": a.version, "store": a.store.kind,
                      "last_sync": a.last_sync, "gateway_version": __version__})

    @router.post("/reload")
    async def reload(request: Request) -> Response:
        a, _ = auth(request)
        return _json(await a.reload())

    return router

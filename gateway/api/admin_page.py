"""The admin web page: ``GET /admin`` (and ``/admin/``) and its static files under ``/admin/static/``.

The page is static HTML, CSS and plain JavaScript shipped in the package (``admin_static/``): no build
step, no CDN, no data in it, so loading it needs no key. The script signs in with the admin key the
operator pastes (kept in sessionStorage) and calls the JSON admin API with it as a Bearer header.

Every answer carries a strict Content-Security-Policy (no inline script or style, same-origin
connections only, no framing), ``nosniff`` and ``no-store``. With the admin API off (no admin key
configured) these routes answer 404 like every other /admin route.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}
_ANY = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# The only files served, with their types: a fixed list, so no path from the request reaches the disk.
STATIC_FILES = {
    "admin.js": "text/javascript; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
}


def _read(name: str) -> bytes:
    return resources.files("gateway.api").joinpath("admin_static").joinpath(name).read_bytes()


def build_router(enabled: Callable[[], bool]) -> APIRouter:
    """The page's routes; ``enabled()`` says whether the admin API is on (else 404, as the API does)."""
    router = APIRouter()
    # Read once: the files are part of the installed package and do not change while it runs.
    index = _read("index.html")
    files = {name: (_read(name), media) for name, media in STATIC_FILES.items()}

    def page(request: Request, body: bytes, media_type: str) -> Response:
        if not enabled():
            raise HTTPException(404)  # the same answer as any unknown path, whatever the method
        if request.method not in ("GET", "HEAD"):
            raise HTTPException(405, headers={"Allow": "GET, HEAD"})
        return Response(body, media_type=media_type, headers=SECURITY_HEADERS)

    # The request-context middleware strips a trailing slash, so this serves /admin and /admin/ alike
    # (the page's own links are absolute, so either address works). Every method is routed here so that
    # with the admin API off even a POST gets the 404 of an unknown path, not a 405 that shows the route.
    @router.api_route("/admin", methods=_ANY, include_in_schema=False)
    async def admin_index(request: Request) -> Response:
        return page(request, index, "text/html; charset=utf-8")

    @router.api_route("/admin/static/{name}", methods=_ANY, include_in_schema=False)
    async def admin_static(request: Request, name: str) -> Response:
        found = files.get(name)
        if found is None:
            raise HTTPException(404)  # the same answer as any unknown path
        return page(request, *found)

    return router

"""The admin web page in a real browser: Playwright driving Debian's chromium against a real gateway on
uvicorn, fake vLLM backends behind it, and the real admin API (file store; Redis for the usage view).

Every test watches the page: no uncaught script error, no Content-Security-Policy violation, no native
dialog, and no console error except the failed loads a test provokes on purpose (a wrong key's 401, a
validation 400). Screenshots of each view land in var/admin-page/ for people to look at.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, Playwright, Request, expect, sync_playwright

from gateway.api.admin_page import CSP, STATIC_FILES
from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes import FakeVLLM
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY
from tests.support.gateway_server import GatewayServer
from tests.support.redis_server import RedisServer

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "var" / "admin-page"
ADMIN_KEY = "adm-page-secret-0123456789"
XSS = "<img src=x onerror=alert(1)>"
STATIC = Path(__file__).resolve().parents[2] / "gateway" / "api" / "admin_static"


# ---- the gateway -------------------------------------------------------------------------------------

def gateway_config(fake: FakeVLLM) -> dict[str, Any]:
    return {
        "models": [{"id": "public-chat", "upstreams": [
            {"name": "fake0", "url": fake.url, "model": "tiny", "api_key": BACKEND_KEY}]}],
        "keys": [{"name": "full", "key": CLIENT_KEY, "rpm": 600, "tpm": 100000, "burst_requests": 60,
                  "per_model": {"public-chat": {"rpm": 300}}}],
        "health": {"interval_s": 30, "timeout_s": 2},
    }


@pytest.fixture
def gateway(fake: FakeVLLM, tmp_path: Path) -> Iterator[GatewayServer]:
    config = parse_config(yaml.safe_dump(gateway_config(fake)), {})
    settings = Settings(access_log=False, admin_key=ADMIN_KEY, state_file=tmp_path / "gateway-state.json")
    with GatewayServer(config, settings) as gw:
        yield gw


def admin_api(gw: GatewayServer) -> httpx.Client:
    return httpx.Client(base_url=gw.url + "/admin", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                        timeout=20, trust_env=False)


def chat(gw: GatewayServer, model: str, key: str = CLIENT_KEY) -> Any:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=20)
    try:
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2)
    finally:
        client.close()


# ---- the browser -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    assert CHROMIUM.exists(), "Debian's chromium is missing: `make system-deps` installs it (apt-get install chromium)"
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
    yield browser
    browser.close()


# Records every security-policy violation, before any page script runs (Playwright's init scripts are
# not subject to the page's CSP).
CSP_WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`), true);
"""


@dataclass
class Watch:
    """What the page did that a clean page never does."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    expected_statuses: set[int] = field(default_factory=set)

    def expect_failed_loads(self, *statuses: int) -> None:
        self.expected_statuses.update(statuses)

    def csp_violations(self) -> list[str]:
        found: list[str] = self.page.evaluate("window.__csp || []")
        return found + [m for m in self.console_errors if "Content Security Policy" in m]

    def unexpected_console_errors(self) -> list[str]:
        out = []
        for text in self.console_errors:
            m = re.match(r"Failed to load resource: the server responded with a status of (\d+)", text)
            if m and int(m.group(1)) in self.expected_statuses:
                continue
            out.append(text)
        return out

    def assert_clean(self) -> None:
        assert self.page_errors == []
        assert self.dialogs == [], "a native dialog opened: script ran that should not have"
        assert self.csp_violations() == []
        assert self.unexpected_console_errors() == []


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, Watch]]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.add_init_script(CSP_WATCH)
    watch = Watch(page)

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            watch.console_errors.append(msg.text)

    def on_dialog(dialog: Dialog) -> None:
        watch.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda exc: watch.page_errors.append(str(exc)))
    page.on("dialog", on_dialog)
    page.on("request", lambda request: watch.requests.append(request))
    yield page, watch
    try:
        if not page.is_closed():
            watch.assert_clean()
    finally:
        context.close()


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, gw: GatewayServer, key: str = ADMIN_KEY) -> None:
    page.goto(gw.url + "/admin/")
    page.fill("#admin-key", key)
    page.click("#signin-form button[type=submit]")


def signed_in(page: Page, gw: GatewayServer) -> None:
    sign_in(page, gw)
    expect(page.locator("#nav")).to_be_visible()
    expect(page.locator("article.model").first).to_be_visible()


def model_card(page: Page, model_id: str) -> Any:
    return page.locator("article.model").filter(has=page.locator("h2.model-id", has_text=model_id))


def upstream_row(page: Page, model_id: str, name: str) -> Any:
    return model_card(page, model_id).locator(f"tr[data-upstream='{name}']")


# ---- the page's files and headers ----------------------------------------------------------------------

def test_the_shipped_files_hold_no_inline_script_or_style() -> None:
    html = (STATIC / "index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []  # every script is a file
    assert re.search(r"\son[a-z]+\s*=", html, re.I) is None  # no inline event handlers
    assert re.search(r"\sstyle\s*=", html, re.I) is None and "<style" not in html
    assert re.search(r"(src|href)=\"(https?:)?//", html) is None  # no CDN
    js = (STATIC / "admin.js").read_text()
    assert ".innerHTML" not in js and "insertAdjacentHTML" not in js and "document.write" not in js
    assert "eval(" not in js and "new Function" not in js


def test_the_package_ships_the_page() -> None:
    # A non-editable install carries only what package-data names: every file the page serves.
    data = tomllib.loads((STATIC.parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    served = {"index.html", *STATIC_FILES}
    assert {p.name for p in STATIC.iterdir()} == served
    assert all(any(fnmatch.fnmatch(f"admin_static/{name}", g) for g in data["gateway.api"]) for name in served)


def test_page_headers_and_the_page_off_without_an_admin_key(gateway: GatewayServer, fake: FakeVLLM) -> None:
    for path in ("/admin/", "/admin"):
        r = httpx.get(gateway.url + path, trust_env=False)  # no key needed: the page holds no data
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert r.headers["content-security-policy"] == CSP
        assert "script-src 'self';" in CSP and "unsafe-inline" not in CSP and "frame-ancestors 'none'" in CSP
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["cache-control"] == "no-store"
        assert '<script src="/admin/static/admin.js"' in r.text
    js = httpx.get(gateway.url + "/admin/static/admin.js", trust_env=False)
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert js.headers["content-security-policy"] == CSP and js.headers["x-content-type-options"] == "nosniff"
    assert js.text == (STATIC / "admin.js").read_text()
    css = httpx.get(gateway.url + "/admin/static/admin.css", trust_env=False)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    r = httpx.post(gateway.url + "/admin/", trust_env=False)
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    head = httpx.head(gateway.url + "/admin/", trust_env=False)
    assert head.status_code == 200 and head.headers["content-security-policy"] == CSP and head.content == b""
    for missing in ("/admin/static/index.html", "/admin/static/nope.js", "/admin/static/..%2Fadmin_page.py"):
        r = httpx.get(gateway.url + missing, trust_env=False)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"

    # No admin key configured: the page is off like the rest of /admin (404, as an unknown path).
    config = parse_config(yaml.safe_dump(gateway_config(fake)), {})
    with GatewayServer(config, Settings(access_log=False)) as off:
        for path in ("/admin/", "/admin", "/admin/static/admin.js", "/admin/static/admin.css"):
            for method in ("GET", "POST", "DELETE"):
                r = httpx.request(method, off.url + path, trust_env=False)
                assert r.status_code == 404, (method, path)
                assert r.json()["error"]["code"] == "unknown_url"


def test_the_browser_enforces_the_csp(gateway: GatewayServer, page: tuple[Page, Watch]) -> None:
    p, watch = page
    p.goto(gateway.url + "/admin/")
    expect(p.locator("#signin")).to_be_visible()
    # The header reached the browser and an injected inline script is refused (a CSP that works).
    ran = p.evaluate("""() => {
        const s = document.createElement("script");
        s.textContent = "window.__inline = 1";
        document.body.append(s);
        return window.__inline === 1;
    }""")
    assert ran is False
    violations = p.evaluate("window.__csp")
    assert violations and violations[0].startswith("script-src")
    p.evaluate("window.__csp = []")
    watch.console_errors.clear()  # the refusal is logged as a console error, on purpose here


# ---- signing in ----------------------------------------------------------------------------------------

def test_sign_in_wrong_key_client_key_and_sign_out(gateway: GatewayServer, page: tuple[Page, Watch]) -> None:
    p, watch = page
    watch.expect_failed_loads(401, 403)
    sign_in(p, gateway, "adm-not-the-key")
    expect(p.locator("#signin-error")).to_have_text("That admin key was not accepted. Check it and try again.")
    expect(p.locator("#nav")).to_be_hidden()
    assert p.evaluate("sessionStorage.length") == 0
    shot(p, "wrong-key")

    p.fill("#admin-key", CLIENT_KEY)
    p.click("#signin-form button[type=submit]")
    expect(p.locator("#signin-error")).to_have_text("That is a client key, not an admin key.")

    p.fill("#admin-key", ADMIN_KEY)
    p.click("#signin-form button[type=submit]")
    expect(model_card(p, "public-chat")).to_be_visible()
    expect(p.locator("#signin-error")).to_be_hidden()
    expect(p.locator("#instance")).to_contain_text("file store")
    # The key lives in sessionStorage only: never in a URL, never in a cookie.
    assert p.evaluate("Object.values(sessionStorage)") == [ADMIN_KEY]
    assert p.context.cookies() == []
    api_calls = [r for r in watch.requests if "/admin/" in r.url and "/admin/static/" not in r.url
                 and not r.url.endswith("/admin/")]
    assert api_calls, "the page made no API call"
    for r in watch.requests:
        assert ADMIN_KEY not in r.url
    assert all(r.headers.get("authorization") in (f"Bearer {ADMIN_KEY}", "Bearer adm-not-the-key",
                                                  f"Bearer {CLIENT_KEY}") for r in api_calls)
    assert api_calls[-1].headers["authorization"] == f"Bearer {ADMIN_KEY}"

    p.reload()  # the tab keeps its sign-in
    expect(model_card(p, "public-chat")).to_be_visible()
    p.click(".tab[data-view=usage]")  # no Redis, no usage: the page says why
    expect(p.locator("#usage-table td.empty")).to_contain_text("without GATEWAY_REDIS_URL")
    expect(p.locator("#usage-chart")).to_contain_text("Nothing to chart yet.")
    p.click("#sign-out")
    expect(p.locator("#signin")).to_be_visible()
    expect(p.locator("#view-models")).to_be_hidden()
    assert p.evaluate("sessionStorage.length") == 0
    assert p.locator("#models-list").inner_text() == ""
    p.reload()
    expect(p.locator("#signin")).to_be_visible()


# ---- models --------------------------------------------------------------------------------------------

def test_create_a_model_with_field_errors_then_drain_undrain_and_delete(
        gateway: GatewayServer, fake_vllm: FakeVLLMFactory, page: tuple[Page, Watch]) -> None:
    p, watch = page
    watch.expect_failed_loads(400, 409)
    other = fake_vllm()
    signed_in(p, gateway)
    expect(upstream_row(p, "public-chat", "fake0").locator(".badge")).to_have_text("up")
    shot(p, "models")

    # A bad URL: the API's message appears at the URL field (the same message the API gives).
    p.click("#model-add")
    p.fill("#m-id", "page-model")
    p.fill("#m-aliases", "pm, page-alias")
    p.fill("[data-param='upstreams.0.name']", "fake1")
    p.fill("[data-param='upstreams.0.url']", "not a url")
    p.fill("[data-param='upstreams.0.model']", "tiny")
    p.fill("[data-param='upstreams.0.api_key']", BACKEND_KEY)
    p.click("#model-form button[type=submit]")
    error = p.locator(".field", has=p.locator("[data-param='upstreams.0.url']")).locator(".field-error")
    expect(error).to_be_visible()
    with admin_api(gateway) as a:
        direct = a.post("/models", json={"id": "page-model", "upstreams": [
            {"name": "fake1", "url": "not a url", "model": "tiny"}]})
    assert direct.status_code == 400 and direct.json()["error"]["param"] == "upstreams.0.url"
    expect(error).to_have_text(direct.json()["error"]["message"])
    expect(p.locator("[data-param='upstreams.0.url']")).to_have_class(re.compile(r"\binvalid\b"))
    shot(p, "model-error")

    p.fill("[data-param='upstreams.0.url']", other.url)
    p.click("#model-form button[type=submit]")
    expect(p.locator("#model-dialog")).to_be_hidden()
    expect(model_card(p, "page-model")).to_be_visible()
    expect(model_card(p, "page-model").locator(".meta")).to_contain_text("aliases: pm, page-alias")
    expect(model_card(p, "page-model").locator(".badge").first).to_have_text("admin")
    # Served at once, by the new backend, under its alias too; the backend key was kept write-only.
    assert chat(gateway, "page-model").model == "page-model"
    assert chat(gateway, "pm").model == "pm"
    with admin_api(gateway) as a:
        created = a.get("/models/page-model").json()
    assert created["upstreams"][0]["api_key_set"] is True and "api_key" not in created["upstreams"][0]

    # Drain the config model's only backend, then undrain it.
    upstream_row(p, "public-chat", "fake0").get_by_role("button", name="Drain").click()
    expect(upstream_row(p, "public-chat", "fake0")).to_contain_text("drained")
    expect(p.locator("#banner")).to_contain_text("fake0 drained")
    with admin_api(gateway) as a:
        ups = a.get("/models/public-chat").json()["upstreams"]
    assert [(u["name"], u.get("weight", 1)) for u in ups] == [("fake0", 0)]
    shot(p, "models-drained")
    upstream_row(p, "public-chat", "fake0").get_by_role("button", name="Undrain").click()
    expect(upstream_row(p, "public-chat", "fake0").get_by_role("button", name="Drain")).to_be_visible()
    with admin_api(gateway) as a:
        ups = a.get("/models/public-chat").json()["upstreams"]
    assert [(u["name"], u.get("weight", 1)) for u in ups] == [("fake0", 1)]
    assert chat(gateway, "public-chat").model == "public-chat"

    # Edit: a second alias list, kept key (no api_key sent back), a new version.
    model_card(p, "page-model").get_by_role("button", name="Edit").click()
    expect(p.locator("#m-id")).to_have_js_property("readOnly", True)
    p.fill("#m-aliases", "pm2")
    p.click("#model-form button[type=submit]")
    expect(model_card(p, "page-model").locator(".meta")).to_contain_text("aliases: pm2")
    assert chat(gateway, "pm2").model == "pm2"  # the backend still gets its key

    # A stale edit: someone changes the model while the form is open; the page sends If-Match, the API
    # answers 409 and the page says so instead of overwriting the other change.
    model_card(p, "page-model").get_by_role("button", name="Edit").click()
    with admin_api(gateway) as a:
        assert a.patch("/models/page-model", json={"aliases": ["other-admin"]}).status_code == 200
    p.fill("#m-aliases", "mine")
    p.click("#model-form button[type=submit]")
    expect(p.locator("#model-form .form-error")).to_contain_text("someone else changed this model")
    p.click("#model-cancel")
    expect(model_card(p, "page-model").locator(".meta")).to_contain_text("aliases: other-admin")
    with admin_api(gateway) as a:
        assert a.get("/models/page-model").json()["aliases"] == ["other-admin"]

    # Delete, with the in-page confirmation.
    model_card(p, "page-model").get_by_role("button", name="Delete").click()
    model_card(p, "page-model").get_by_role("button", name="Yes, delete").click()
    expect(model_card(p, "page-model")).to_have_count(0)
    with pytest.raises(openai.NotFoundError):
        chat(gateway, "page-model")


def test_a_hostile_model_name_renders_as_text(gateway: GatewayServer, fake_vllm: FakeVLLMFactory,
                                              page: tuple[Page, Watch]) -> None:
    p, watch = page
    other = fake_vllm()
    signed_in(p, gateway)
    p.click("#model-add")
    p.fill("#m-id", XSS)
    p.fill("#m-aliases", "<script>alert(2)</script>")
    p.fill("[data-param='upstreams.0.name']", "xss-up")  # upstream names are restricted; model ids are not
    p.fill("[data-param='upstreams.0.url']", other.url)
    p.fill("[data-param='upstreams.0.model']", "tiny")
    p.fill("[data-param='upstreams.0.api_key']", BACKEND_KEY)
    p.click("#model-form button[type=submit]")
    card = model_card(p, XSS)
    expect(card.locator("h2.model-id")).to_have_text(XSS)
    expect(card.locator(".meta")).to_contain_text("<script>alert(2)</script>")
    assert p.locator("main img, main script").count() == 0
    shot(p, "xss")
    p.click(".tab[data-view=backends]")
    expect(p.locator("#backends-table")).to_contain_text(XSS)
    assert p.locator("main img").count() == 0
    shot(p, "xss-backends")
    assert chat(gateway, XSS).model == XSS
    assert watch.dialogs == []


# ---- keys ----------------------------------------------------------------------------------------------

def test_create_copy_edit_and_revoke_a_key(gateway: GatewayServer, page: tuple[Page, Watch]) -> None:
    p, _watch = page
    p.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gateway.url)
    signed_in(p, gateway)
    p.click(".tab[data-view=keys]")
    expect(p.locator("tr[data-key='full']")).to_contain_text("600")
    expect(p.locator("tr[data-key='full'] .limit-notes")).to_have_text("burst 60 requests · public-chat: rpm 300")

    p.fill("#key-name", "team-page")
    p.fill("#key-models", "public-chat")
    p.fill("#key-rpm", "100")
    p.click("#key-form button[type=submit]")
    expect(p.locator("#key-secret")).to_be_visible()
    secret = p.locator("#key-secret-value").inner_text()
    assert re.fullmatch(r"sk-gw-[A-Za-z0-9_-]{20,}", secret), secret
    row = p.locator("tr[data-key='team-page']")
    expect(row).to_contain_text("public-chat")
    expect(row.locator("td").nth(3)).to_have_text("100")
    prefix = row.locator("td").nth(1).inner_text().rstrip("…")
    assert prefix and secret.startswith(prefix) and len(prefix) < len(secret)
    p.click("#key-copy")
    expect(p.locator("#key-copy-status")).to_have_text("Copied to the clipboard.")
    assert p.evaluate("navigator.clipboard.readText()") == secret
    shot(p, "keys")
    # The secret is shown once: gone when dismissed, and not in the list.
    p.click("#key-secret-done")
    expect(p.locator("#key-secret")).to_be_hidden()
    assert secret not in p.content()
    with admin_api(gateway) as a:
        listed = a.get("/keys").text
    assert secret not in listed

    assert chat(gateway, "public-chat", key=secret).model == "public-chat"

    # Edit its limits.
    row.get_by_role("button", name="Edit").click()
    row.locator("input[data-param='rpm']").fill("50")
    row.get_by_role("button", name="Save").click()
    expect(p.locator("tr[data-key='team-page'] td").nth(3)).to_have_text("50")
    with admin_api(gateway) as a:
        assert a.get("/keys").json()["data"][-1]["rpm"] == 50

    # Revoke, with the in-page confirmation: the proxy refuses the key from then on.
    row = p.locator("tr[data-key='team-page']")
    row.get_by_role("button", name="Revoke").click()
    row.get_by_role("button", name="Yes, revoke").click()
    expect(p.locator("tr[data-key='team-page']")).to_have_count(0)
    expect(p.locator("#banner")).to_contain_text("team-page revoked")
    with pytest.raises(openai.AuthenticationError):
        chat(gateway, "public-chat", key=secret)
    assert chat(gateway, "public-chat").model == "public-chat"  # other keys unaffected


# ---- backends and usage (Redis, so usage is recorded) --------------------------------------------------

def test_backends_and_usage_views(fake: FakeVLLM, fake_vllm: FakeVLLMFactory, redis_server: RedisServer,
                                  tmp_path: Path, page: tuple[Page, Watch]) -> None:
    p, _watch = page
    dead = fake_vllm()
    cfg = gateway_config(fake)
    cfg["models"].append({"id": "second", "upstreams": [
        {"name": "gone", "url": dead.url, "model": "tiny", "api_key": BACKEND_KEY}]})
    cfg["models"][0]["aliases"] = ["gpt-4o"]
    cfg["models"][0]["upstreams"].append(  # drained in the config file
        {"name": "fake0-b", "url": fake.url + "/v1", "model": "tiny", "api_key": BACKEND_KEY, "weight": 0})
    cfg["keys"].append({"name": "team-b", "key": "sk-team-b-test", "models": ["public-chat"]})
    cfg["health"] = {"interval_s": 0.5, "timeout_s": 1}
    dead.stop()  # its port refuses connections: the health probe marks it down
    settings = Settings(access_log=False, admin_key=ADMIN_KEY, redis_url=redis_server.url)
    with GatewayServer(parse_config(yaml.safe_dump(cfg), {}), settings) as gw:
        for _ in range(3):
            chat(gw, "public-chat")
        chat(gw, "gpt-4o", key="sk-team-b-test")
        signed_in(p, gw)
        expect(upstream_row(p, "second", "gone").locator(".badge")).to_have_text("down", timeout=15_000)
        expect(p.locator("#instance")).to_contain_text("redis store")
        shot(p, "models-health")  # the docs' screenshot (docs/admin-page.png)
        p.click(".tab[data-view=backends]")
        expect(p.locator("tr[data-backend='fake0'] .badge")).to_have_text("up")
        # Auto-refresh: the dead backend turns "down" without a reload.
        expect(p.locator("tr[data-backend='gone'] .badge").first).to_have_text("down", timeout=15_000)
        expect(p.locator("#backends-updated")).to_contain_text("every 5 s")
        shot(p, "backends")

        # Usage reaches Redis within a flush interval: poll the API, then look at the page.
        with admin_api(gw) as a:
            for _ in range(200):
                rows = a.get("/usage", params={"days": 1}).json()["data"]
                if sum(r["requests"] for r in rows) >= 4:
                    break
                p.wait_for_timeout(50)
        by_key = {r["key"]: r for r in rows}
        assert by_key["full"]["requests"] == 3 and by_key["team-b"]["requests"] == 1, rows
        p.click(".tab[data-view=usage]")
        expect(p.locator("#usage-table tbody tr")).to_have_count(len(rows))
        for i, r in enumerate(rows):
            cells = p.locator("#usage-table tbody tr").nth(i).locator("td")
            expect(cells.nth(1)).to_have_text(r["key"])
            expect(cells.nth(3)).to_have_text(str(r["requests"]))
            expect(cells.nth(6)).to_have_text(f"{r['total_tokens']:,}")
        # One bar per key and model, the largest first, each as long as its share of the largest.
        bars = p.locator("#usage-chart svg.bars .bar-row")
        expect(bars).to_have_count(2)
        expect(bars.first.locator("text.bar-label")).to_have_text("full · public-chat")
        expect(bars.first.locator("text.bar-value")).to_have_text(f"{by_key['full']['total_tokens']:,}")
        expect(bars.nth(1).locator("text.bar-label")).to_have_text("team-b · public-chat")

        def bar_length(i: int) -> float:
            row = bars.nth(i)
            return sum(float(row.locator(f"rect.{c}").get_attribute("width") or 0)
                       for c in ("bar-prompt", "bar-completion"))

        ratio = by_key["team-b"]["total_tokens"] / by_key["full"]["total_tokens"]
        assert bar_length(0) == pytest.approx(520) and bar_length(1) == pytest.approx(520 * ratio)
        shot(p, "usage")
        p.click("#sign-out")  # stops the auto-refresh before this gateway stops

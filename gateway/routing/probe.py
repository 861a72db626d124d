"""Check one vLLM upstream the way a request would meet it.

Used by the gateway's background health prober (readiness, routing) and by
``gateway backends verify``. Steps: ``GET /health`` (no key), then ``GET /v1/models`` with the
upstream's key (401/403 means the backend's ``--api-key`` differs from the config), then that the
configured served name is listed (else the backend serves other names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import httpx

from gateway.config.schema import UpstreamSpec
from gateway.errors import is_fd_exhaustion


class ProbeState(StrEnum):
    OK = "ok"
    DOWN = "down"  # connection refused / timed out
    UNHEALTHY = "unhealthy"  # /health answered non-200 (engine dead or starting)
    KEY_MISMATCH = "key_mismatch"  # /v1/models answered 401/403 to the configured key
    MODEL_MISSING = "model_missing"  # the served name is not in /v1/models
    ERROR = "error"  # anything else unexpected (non-JSON, 5xx from /v1/models, ...)
    LOCAL_ERROR = "local_error"  # this process could not probe (out of file descriptors): not the backend
    UNKNOWN = "unknown"  # not probed yet


@dataclass(frozen=True)
class ProbeResult:
    state: ProbeState
    detail: str
    served: tuple[str, ...] = field(default_factory=tuple)
    max_model_len: int | None = None  # from the backend's model card for the configured name

    @property
    def ok(self) -> bool:
        return self.state is ProbeState.OK


def _transport_failure(base: str, exc: httpx.HTTPError) -> ProbeResult:
    if is_fd_exhaustion(exc):
        return ProbeResult(ProbeState.LOCAL_ERROR,
                           f"could not probe {base}: this process is out of file descriptors ({exc})")
    return ProbeResult(ProbeState.DOWN, f"{base} unreachable: {type(exc).__name__}: {exc}")


async def probe_upstream(client: httpx.AsyncClient, upstream: UpstreamSpec, timeout: float) -> ProbeResult:
    """``probe: full`` (vLLM's default): /health then /v1/models; ``models`` (``kind: openai``'s
    default: a cloud API has no /health): /v1/models only."""
    base = upstream.url
    if upstream.probe_mode == "models" or upstream.kind == "openai":  # (passive: when asked, e.g. verify)
        return await _probe_models(client, upstream, timeout)
    try:
        r = await client.get(f"{base}/health", timeout=timeout)
    except httpx.TimeoutException:
        return ProbeResult(ProbeState.DOWN, f"{base}/health timed out after {timeout:g}s")
    except httpx.HTTPError as exc:
        return _transport_failure(base, exc)
    if r.status_code != 200:
        return ProbeResult(ProbeState.UNHEALTHY, f"{base}/health answered {r.status_code}")
    return await _probe_models(client, upstream, timeout)


async def _probe_models(client: httpx.AsyncClient, upstream: UpstreamSpec, timeout: float) -> ProbeResult:
    base = upstream.url
    headers = {}
    key = upstream.api_key_value()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        r = await client.get(f"{base}/v1/models", headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return ProbeResult(ProbeState.DOWN, f"{base}/v1/models timed out after {timeout:g}s")
    except httpx.HTTPError as exc:
        return _transport_failure(base, exc)
    if r.status_code in (401, 403):
        return ProbeResult(
            ProbeState.KEY_MISMATCH,
            f"{base}/v1/models answered {r.status_code}: the backend's --api-key does not match "
            f"the api_key configured for upstream {upstream.name!r}" if upstream.kind == "vllm" else
            f"{base}/v1/models answered {r.status_code}: the provider refused the api_key configured for "
            f"upstream {upstream.name!r}",
        )
    if r.status_code != 200:
        return ProbeResult(ProbeState.ERROR, f"{base}/v1/models answered {r.status_code}")
    try:
        data = r.json()
        served = tuple(str(m["id"]) for m in data["data"])
    except (ValueError, KeyError, TypeError):
        return ProbeResult(ProbeState.ERROR, f"{base}/v1/models did not answer an OpenAI model list")
    if upstream.model not in served:
        return ProbeResult(
            ProbeState.MODEL_MISSING,
            f"{base} does not serve {upstream.model!r} (it serves: {', '.join(served) or 'nothing'}); "
            f"set the upstream's `model` to the backend's --served-model-name",
            served,
        )
    card = next(m for m in data["data"] if str(m["id"]) == upstream.model)
    max_len = card.get("max_model_len") if isinstance(card, dict) else None
    return ProbeResult(ProbeState.OK, "ok", served,
                       max_len if isinstance(max_len, int) and not isinstance(max_len, bool) else None)

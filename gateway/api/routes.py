"""The OpenAI endpoints the gateway serves, and forgiving path normalisation.

Clients whose base_url is off by ``/v1`` (missing, doubled) or that add a trailing slash reach
the same endpoint: ``/chat/completions``, ``/v1/v1/chat/completions/`` -> ``/v1/chat/completions``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    kind: str  # "chat", "completions", "embeddings", "responses"
    path: str  # the upstream path, same as the public one
    required: tuple[tuple[str, type | tuple[type, ...], str], ...]  # (field, types, description)
    dialect: str = "openai"  # "anthropic": Anthropic auth headers, error envelope and stream events


PROXY_ROUTES: dict[str, ProxyRoute] = {
    "/v1/chat/completions": ProxyRoute(
        "chat", "/v1/chat/completions", (("messages", list, "an array of messages"),)
    ),
    "/v1/completions": ProxyRoute(
        "completions", "/v1/completions", (("prompt", (str, list), "a string or an array"),)
    ),
    "/v1/embeddings": ProxyRoute(
        "embeddings", "/v1/embeddings", (("input", (str, list), "a string or an array"),)
    ),
    "/v1/responses": ProxyRoute(
        "responses", "/v1/responses", (("input", (str, list), "a string or an array of input items"),)
    ),
    "/v1/messages": ProxyRoute(
        "messages", "/v1/messages", (("messages", list, "an array of messages"),), "anthropic"
    ),
    "/v1/messages/count_tokens": ProxyRoute(
        "count_tokens", "/v1/messages/count_tokens", (("messages", list, "an array of messages"),), "anthropic"
    ),
}

_API_TAILS = ("/chat/completions", "/completions", "/embeddings", "/responses", "/models", "/messages")
PUBLIC_PATHS = (*PROXY_ROUTES, "/v1/models", "/v1/models/{model}", "/health", "/health/ready", "/metrics")

# Route label values for metrics: fixed, never raw paths.
ROUTE_LABELS = {p: p for p in (*PROXY_ROUTES, "/v1/models", "/health", "/health/ready", "/metrics")}


_V1_RUN = re.compile(r"(?:/v1)+(?=/|$)")


def normalize_path(path: str) -> str:
    if path in ROUTE_LABELS:  # the common case: a public path as it is written
        return path
    p = path.rstrip("/") or "/"
    m = _V1_RUN.match(p)  # one scan, not one slice per /v1: linear in the number of repeated /v1
    rest = p[m.end():] if m else p
    if rest and any(rest == t or rest.startswith(t + "/") for t in _API_TAILS):
        return "/v1" + rest
    return p


def route_label(path: str) -> str:
    label = ROUTE_LABELS.get(path)
    if label is not None:
        return label
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path.startswith("/admin/"):
        return "/admin"
    return "other"


def suggest(path: str) -> str | None:
    match = difflib.get_close_matches(path, PUBLIC_PATHS, n=1, cutoff=0.5)
    return match[0] if match else None

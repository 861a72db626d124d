"""Every failure the gateway reports, as one exception tree rendered in OpenAI's error format.

    GatewayError                          status  type                    code                       fail-over  client
    ├── InvalidRequest                    400     invalid_request_error   (varies)
    ├── AuthenticationFailed              401     invalid_request_error   invalid_api_key
    ├── PermissionDenied                  403     invalid_request_error   permission_denied
    ├── ModelNotFound                     404     invalid_request_error   model_not_found
    ├── NotFound                          404     invalid_request_error   not_found
    ├── RouteNotFound                     404     invalid_request_error   unknown_url
    ├── MethodNotAllowed                  405     invalid_request_error   method_not_allowed
    ├── Conflict                          409     invalid_request_error   conflict
    ├── PayloadTooLarge                   413     invalid_request_error   request_too_large
    ├── UnsupportedMediaType              415     invalid_request_error   unsupported_content_encoding
    ├── EndpointNotSupported              400     invalid_request_error   unsupported_endpoint       yes        no
    ├── UpstreamRejected                  4xx     (from the upstream)     (normalised upstream error)
    ├── RateLimited                       429     requests / tokens       rate_limit_exceeded
    ├── LimiterUnavailable                503     server_error            rate_limiter_unavailable
    ├── InternalError                     500     server_error            internal_error
    ├── OutOfFileDescriptors              503     server_error            gateway_out_of_file_descriptors
    ├── ModelOverloaded                   503     server_error            model_overloaded                      after
    ├── ShuttingDown                      503     server_error            gateway_shutting_down                 yes
    └── UpstreamError                     502     server_error            bad_gateway                yes
        ├── UpstreamAuthFailed            502     server_error            upstream_auth_failed       yes        no
        ├── UpstreamModelMissing          502     server_error            upstream_model_not_found   yes        no
        ├── UpstreamBadResponse           502     server_error            bad_upstream_response                 no
        ├── UpstreamUnavailable           503     server_error            upstream_unavailable       yes        after
        │   └── CircuitOpen               503     server_error            no_upstream_available                 after
        └── UpstreamTimeout               504     server_error            upstream_timeout                      no

``retryable`` (fail-over) means the request may be sent to another upstream of the same model, which
the forwarder does only before any byte of the response reached the client.

``client_retry`` is the advice to the client's SDK (the openai and anthropic SDKs retry 408, 409,
429 and every 5xx twice by default): ``False`` sends ``x-should-retry: false`` (the answer will not
change, or the generation may still be running: a 504 retried runs it again on the GPU), and
``retry_after_s`` sends ``retry-after`` (seconds) for a backend that may be back soon.

On the Anthropic routes (``/v1/messages``) the same errors are rendered in Anthropic's envelope,
``{"type": "error", "error": {"type", "message"}}``, with the same status (``gateway.api.anthropic_errors``).
"""

from __future__ import annotations

import errno
from typing import Any

import orjson


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"
    retryable: bool = False
    client_retry: bool | None = None  # False: x-should-retry: false; None: the client decides
    retry_after_s: int | None = None  # set: retry-after on the response

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail  # for the operator's log only, never sent to the client
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def policy_headers(self) -> list[tuple[bytes, bytes]]:
        """The response headers this error's class prescribes (retry advice, authentication scheme)."""
        h: list[tuple[bytes, bytes]] = []
        retry = self.client_retry
        if retry is None and self.status in (400, 413, 422):
            retry = False  # a validation error: retrying cannot succeed
        if retry is not None and "x-should-retry" not in self.headers:
            h.append((b"x-should-retry", b"true" if retry else b"false"))
        if self.retry_after_s is not None and "retry-after" not in self.headers:
            h.append((b"retry-after", str(self.retry_after_s).encode()))
        if self.status == 401:
            h.append((b"www-authenticate", b'Bearer realm="vllm-gateway"'))
        return h


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = None


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    """A valid key without the right for this route (a client key on an admin route)."""

    status = 403
    type = "invalid_request_error"
    code = "permission_denied"
    client_retry = False


class NotFound(GatewayError):
    """An admin resource (a client key, an upstream) that does not exist."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Conflict(GatewayError):
    """An admin edit based on a stale version (If-Match), or creating what already exists."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"
    client_retry = False


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class EndpointNotSupported(GatewayError):
    """The model's backend does not serve this endpoint (embeddings on a generation model): the
    client's choice of model. Another upstream of the model may serve it, so fail-over is allowed."""

    status = 400
    type = "invalid_request_error"
    code = "unsupported_endpoint"
    retryable = True
    client_retry = False


class UpstreamRejected(GatewayError):
    """The upstream refused the request itself (its 4xx); status, message and param are kept."""

    type = "invalid_request_error"
    code = None


class RateLimited(GatewayError):
    """A rate limit refused the request; ``type`` says which (``requests`` or ``tokens``)."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"


class LimiterUnavailable(GatewayError):
    """The shared rate limiter (Redis) did not answer and the policy is fail_closed."""

    status = 503
    code = "rate_limiter_unavailable"


class InternalError(GatewayError):
    status = 500


class OutOfFileDescriptors(GatewayError):
    """This process has no file descriptor left (EMFILE/ENFILE): a local fault, never the backend's."""

    status = 503
    code = "gateway_out_of_file_descriptors"


class ModelOverloaded(GatewayError):
    """Every usable upstream of the model is over its ``shed`` thresholds: refused before anything was
    sent, instead of piling onto vLLM's queue. Fallback models may take it (nothing reached a backend)."""

    status = 503
    code = "model_overloaded"
    retry_after_s = 1


class ShuttingDown(GatewayError):
    """This gateway process is shutting down: an open stream outlived the graceful-shutdown period.
    Another replica will take a retry."""

    status = 503
    code = "gateway_shutting_down"
    client_retry = True


def is_fd_exhaustion(exc: BaseException) -> bool:
    """True when ``exc`` or an exception it was raised from is EMFILE or ENFILE."""
    seen: BaseException | None = exc
    for _ in range(8):  # cause/context chains are short; never loop on a cycle
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.EMFILE, errno.ENFILE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class UpstreamError(GatewayError):
    status = 502
    code = "bad_gateway"
    retryable = True


class UpstreamAuthFailed(UpstreamError):
    code = "upstream_auth_failed"
    client_retry = False  # a configuration error: the same answer until an operator fixes it


class UpstreamModelMissing(UpstreamError):
    code = "upstream_model_not_found"
    client_retry = False


class UpstreamBadResponse(UpstreamError):
    code = "bad_upstream_response"
    retryable = False
    client_retry = False


class UpstreamUnavailable(UpstreamError):
    status = 503
    code = "upstream_unavailable"
    retry_after_s = 2


class CircuitOpen(UpstreamUnavailable):
    """No upstream of the model (nor of its fallbacks) can take a request now: every circuit is open
    (or, with fallbacks configured, every upstream is down). Nothing was sent."""

    code = "no_upstream_available"
    retryable = False


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    retryable = False
    client_retry = False  # the generation may still be running: a retry would run it again

"""Every failure the gateway reports, as one exception tree rendered in OpenAI's error format.

    GatewayError                          status  type                    code
    ├── InvalidRequest                    400     invalid_request_error   (varies)
    ├── AuthenticationFailed              401     invalid_request_error   invalid_api_key
    ├── ModelNotFound                     404     invalid_request_error   model_not_found
    ├── RouteNotFound                     404     invalid_request_error   unknown_url
    ├── MethodNotAllowed                  405     invalid_request_error   method_not_allowed
    ├── PayloadTooLarge                   413     invalid_request_error   request_too_large
    ├── UpstreamRejected                  4xx     (from the upstream)     (normalised upstream error)
    ├── InternalError                     500     server_error            internal_error
    └── UpstreamError                     502     server_error            bad_gateway        retryable
        ├── UpstreamAuthFailed            502     server_error            upstream_auth_failed   retryable
        ├── UpstreamModelMissing          502     server_error            upstream_model_not_found retryable
        ├── UpstreamBadResponse           502     server_error            bad_upstream_response
        ├── UpstreamUnavailable           503     server_error            upstream_unavailable   retryable
        └── UpstreamTimeout               504     server_error            upstream_timeout

``retryable`` means the request may be sent to another upstream of the same model, which the
forwarder does only before any byte of the response reached the client.
"""

from __future__ import annotations

from typing import Any

import orjson


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
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


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = None


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


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


class UpstreamRejected(GatewayError):
    """The upstream refused the request itself (its 4xx); status, message and param are kept."""

    type = "invalid_request_error"
    code = None


class InternalError(GatewayError):
    status = 500


class UpstreamError(GatewayError):
    status = 502
    code = "bad_gateway"
    retryable = True


class UpstreamAuthFailed(UpstreamError):
    code = "upstream_auth_failed"


class UpstreamModelMissing(UpstreamError):
    code = "upstream_model_not_found"


class UpstreamBadResponse(UpstreamError):
    code = "bad_upstream_response"
    retryable = False


class UpstreamUnavailable(UpstreamError):
    status = 503
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    retryable = False

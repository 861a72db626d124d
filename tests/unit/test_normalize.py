"""Upstream error bodies (exact vLLM 0.32 captures) -> the gateway's OpenAI-format errors."""

from __future__ import annotations

import pytest

from gateway.config.schema import UpstreamSpec
from gateway.domain import Upstream
from gateway.errors import GatewayError, UpstreamBadResponse
from gateway.upstream.normalize import check_success_body, from_error_response

UP = Upstream.from_spec("pub", UpstreamSpec(name="gpu0", url="http://127.0.0.1:1", model="tiny"))

UNAUTHORIZED = b'{"error":"Unauthorized"}'
NOT_FOUND_MODEL = (b'{"error":{"message":"The model `tiny` does not exist. Valid aliases: other.",'
                   b'"type":"NotFoundError","param":"model","code":404}}')
DETAIL_404 = b'{"detail":"Not Found"}'
CONTEXT = (b'{"error":{"message":"This model\'s maximum context length is 512 tokens. However, your prompt '
           b'contains at least 513 input tokens, which exceeds this limit even without any output tokens. '
           b'Please reduce the length of the input prompt. (parameter=input_tokens, value=513)",'
           b'"type":"BadRequestError","param":"input_tokens","code":400}}')
MISSING_MESSAGES = (b'{"error":{"message":"1 validation error:\\n  {\'type\': \'missing\', \'loc\': \'body.messages\', '
                    b'\'msg\': \'Field required\', \'input\': \'<dict of 2 items>\'}","type":"Bad Request",'
                    b'"param":"body.messages","code":400}}')
TEMPERATURE = (b'{"error":{"message":"temperature must be non-negative, got -1.0. (parameter=temperature, '
               b'value=-1.0)","type":"BadRequestError","param":"temperature","code":400}}')
ENGINE_DEAD = (b'{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root '
               b'cause.","type":"InternalServerError","param":null,"code":500}}')


def _norm(status: int, body: bytes) -> GatewayError:
    return from_error_response(status, body, UP, "/v1/chat/completions")


def _shape(err: GatewayError) -> None:
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["code"] is None or isinstance(body["code"], str)
    assert "sk-" not in body["message"]


def test_backend_rejects_gateway_key_is_a_502_that_says_so() -> None:
    err = _norm(401, UNAUTHORIZED)
    _shape(err)
    assert err.status == 502 and err.code == "upstream_auth_failed" and "--api-key" in err.message
    assert err.retryable


def test_backend_does_not_serve_the_name() -> None:
    err = _norm(404, NOT_FOUND_MODEL)
    _shape(err)
    assert err.status == 502 and err.code == "upstream_model_not_found"
    assert err.client_retry is False  # the same answer until an operator fixes the config
    # The backend's served names are for the operator's log, not for any client.
    assert "gpu0" in err.message and "tiny" not in err.message and "other" not in err.message
    assert err.detail is not None
    assert "'tiny'" in err.detail and "Valid aliases: other" in err.detail


def test_backend_lacks_the_route() -> None:
    # vLLM answers 404 Not Found for an endpoint its model type does not serve (embeddings on a
    # generation model): the client's choice of model, a 4xx naming the model and the route.
    err = _norm(404, DETAIL_404)
    _shape(err)
    assert err.status == 400 and err.code == "unsupported_endpoint" and err.param == "model"
    assert "`pub`" in err.message and "/v1/chat/completions" in err.message
    assert err.retryable and err.client_retry is False  # another upstream may serve it; the SDK must not


def test_context_length_keeps_the_message_and_gets_the_openai_code() -> None:
    err = _norm(400, CONTEXT)
    _shape(err)
    assert err.status == 400 and err.code == "context_length_exceeded"
    assert err.message.startswith("This model's maximum context length is 512 tokens")
    assert err.type == "invalid_request_error" and err.param == "input_tokens"


def test_validation_errors_keep_status_and_get_field_names() -> None:
    err = _norm(400, MISSING_MESSAGES)
    assert err.status == 400 and err.param == "messages" and err.code is None
    err = _norm(400, TEMPERATURE)
    assert err.status == 400 and err.param == "temperature" and "non-negative" in err.message


def test_5xx_html_and_garbage() -> None:
    err = _norm(500, ENGINE_DEAD)
    assert err.status == 502 and "EngineCore" in err.message and err.retryable
    err = _norm(502, b"<html><body>Bad Gateway</body></html>")
    assert err.status == 502
    err = _norm(503, b"")
    assert err.status == 503
    err = _norm(418, b"<html>teapot</html>")
    assert err.status == 418 and "teapot" in err.message
    _shape(err)


def test_success_bodies_are_checked() -> None:
    assert check_success_body(b'{"choices":[]}', "chat", UP) == {"choices": []}
    with pytest.raises(UpstreamBadResponse):
        check_success_body(b'{"id":"x"}', "chat", UP)
    with pytest.raises(UpstreamBadResponse):
        check_success_body(b"<html>", "completions", UP)
    assert check_success_body(b'{"data":[]}', "embeddings", UP) == {"data": []}
    with pytest.raises(GatewayError) as info:
        check_success_body(b'{"error":{"message":"boom"}}', "chat", UP)
    assert info.value.status == 502 and "boom" in info.value.message

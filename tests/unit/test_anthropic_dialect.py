"""The Anthropic dialect's pure parts: error types, envelope, stream relay, usage, aliases in the config."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api import anthropic_errors
from gateway.api.anthropic import STREAM_ENDS, AnthropicDialect
from gateway.api.context import RequestContext
from gateway.config import ConfigError, parse_config
from gateway.errors import (
    AuthenticationFailed,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    PayloadTooLarge,
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.mappings.snapshot import ModelTable
from gateway.upstream.sse import SseRelay

# vLLM 0.32's stream for max_tokens 2 (recorded), served name "tiny".
STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-a61cae5c64dca4e1",'
    b'"type":"message","role":"assistant","content":[],"model":"tiny","stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":20,"output_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","content_block":{"type":"text","text":""},'
    b'"index":0}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta",'
    b'"text":"\\"model\\":\\"tiny\\" event: message_stop \\"type\\":\\"error\\""},"index":0}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"ck"},'
    b'"index":0}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},'
    b'"usage":{"input_tokens":20,"output_tokens":2}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def _ctx() -> RequestContext:
    return RequestContext("rid-1", 0.0, "/v1/messages")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30))
def test_any_rechunking_relays_event_lines_and_rewrites_only_the_model_field(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    relay = SseRelay("tiny", "claude-house", STREAM_ENDS)
    dialect, ctx = AnthropicDialect(), _ctx()
    out = b""
    for c in chunks:
        piece = relay.feed(c)
        if piece:
            out += dialect.observe(piece, ctx)
    out += relay.flush()
    assert out == STREAM.replace(b'"model":"tiny"', b'"model":"claude-house"')
    assert b'\\"model\\":\\"tiny\\"' in out  # generated text is never rewritten
    assert relay.saw_done
    assert ctx.usage == (20, 2)


def test_text_that_looks_like_an_end_does_not_end_the_stream() -> None:
    relay = SseRelay("tiny", "x", STREAM_ENDS)
    relay.feed(STREAM.split(b"event: content_block_stop")[0])
    assert not relay.saw_done


def test_backend_error_event_is_normalised_and_ends_the_stream() -> None:
    head = STREAM.split(b"event: content_block_delta")[0]
    err = b'event: error\ndata: {"type":"error","error":{"type":"internal_error","message":"boom"}}\n\n'
    relay, dialect, ctx = SseRelay("tiny", "x", STREAM_ENDS), AnthropicDialect(), _ctx()
    out = dialect.observe(relay.feed(head + err), ctx)
    assert relay.saw_done
    last = out.rstrip(b"\n").rsplit(b"\n\n", 1)[1]
    assert last.startswith(b"event: error\ndata: ")
    body = orjson.loads(last.split(b"data: ", 1)[1])
    assert body == {"type": "error", "error": {"type": "api_error", "message": "boom"}, "request_id": "rid-1"}
    assert out.startswith(b"event: message_start") and out.endswith(b"\n\n")


@pytest.mark.parametrize(
    ("err", "status", "type_"),
    [
        (InvalidRequest("x"), 400, "invalid_request_error"),
        (AuthenticationFailed("x"), 401, "authentication_error"),
        (ModelNotFound("x"), 404, "not_found_error"),
        (PayloadTooLarge("x"), 413, "request_too_large"),
        (UpstreamRejected("x", status=429), 429, "rate_limit_error"),
        (UpstreamRejected("x", status=422), 422, "invalid_request_error"),
        (InternalError("x"), 500, "api_error"),
        (UpstreamError("x"), 502, "api_error"),
        (UpstreamAuthFailed("x"), 502, "api_error"),
        (UpstreamUnavailable("x"), 503, "overloaded_error"),
        (UpstreamTimeout("x"), 504, "timeout_error"),
    ],
)
def test_error_envelope(err: Exception, status: int, type_: str) -> None:
    assert isinstance(err, InvalidRequest | AuthenticationFailed | ModelNotFound | PayloadTooLarge
                      | UpstreamRejected | InternalError | UpstreamError)
    assert err.status == status
    assert anthropic_errors.body(err, "r") == {"type": "error", "error": {"type": type_, "message": "x"},
                                               "request_id": "r"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [("internal_error", "api_error"), ("BadRequestError", "invalid_request_error"), ("Bad Request",
     "invalid_request_error"), ("NotFoundError", "not_found_error"), ("overloaded_error", "overloaded_error"),
     (None, "api_error"), ("SomethingNew", "api_error")],
)
def test_foreign_error_types(name: str | None, expected: str) -> None:
    assert anthropic_errors.anthropic_type_of(name) == expected


def test_credentials_authorization_wins_then_x_api_key() -> None:
    d = AnthropicDialect()
    assert d.credentials([(b"x-api-key", b"k1"), (b"authorization", b"Bearer k2")]) == "Bearer k2"
    assert d.credentials([(b"x-api-key", b" k1 ")]) == "Bearer k1"
    with pytest.raises(AuthenticationFailed, match="x-api-key"):
        d.credentials([(b"x-api-key", b"")])


CONFIG = """
models:
  - id: a
    aliases: %s
    upstreams: [{url: "http://127.0.0.1:1", model: m}]
  - id: b
    aliases: %s
    upstreams: [{url: "http://127.0.0.1:2", model: m}]
"""


@pytest.mark.parametrize(
    ("a", "b", "problem"),
    [
        ("[b]", "[]", "alias 'b' of model 'a' collides with the id of model 'b'"),
        ("[x]", "[x]", "alias 'x' of model 'b' collides with an alias of model 'a'"),
        ("[x, x]", "[]", "alias 'x' of model 'a' collides with an alias of model 'a'"),
        ("[a]", "[]", "alias 'a' of model 'a' collides with the id of model 'a'"),
        ("[' x']", "[]", "must be a non-empty string"),
    ],
)
def test_alias_collisions_are_named(a: str, b: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(CONFIG % (a, b), {})
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_aliases_resolve_to_their_model() -> None:
    table = ModelTable.from_config(parse_config(CONFIG % ("[claude-x, gpt-4o]", "[]"), {}))

    class Anyone:
        def may_use(self, model_id: str) -> bool:
            return model_id == "a"

    assert table.resolve("gpt-4o", Anyone()).id == "a"
    assert table.resolve("a", Anyone()).aliases == ("claude-x", "gpt-4o")
    assert [e.id for e in table.visible_to(Anyone())] == ["a"]
    with pytest.raises(ModelNotFound):
        table.resolve("b", Anyone())

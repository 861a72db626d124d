"""SseRelay: any re-chunking of the upstream bytes gives the same client bytes and events."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.sse import SseRelay, error_event

VLLM_STREAM = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"\xef\xbf\xbd match"},"finish_reason":null}]}\n\n'
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"tiny",'
    b'"choices":[],"usage":{"prompt_tokens":10,"total_tokens":14,"completion_tokens":4}}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = VLLM_STREAM.replace(b'"model":"tiny"', b'"model":"public/m-7b"')


def _relay_all(chunks: list[bytes]) -> tuple[bytes, SseRelay]:
    relay = SseRelay("tiny", "public/m-7b")
    out = b"".join(relay.feed(c) for c in chunks) + relay.flush()
    return out, relay


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_any_rechunking_gives_the_same_bytes(cuts: list[int]) -> None:
    out, relay = _relay_all(_split(VLLM_STREAM, cuts))
    assert out == EXPECTED
    assert relay.saw_done


def test_complete_events_are_released_immediately() -> None:
    relay = SseRelay("tiny", "pub")
    first = VLLM_STREAM.split(b"\n\n")[0] + b"\n\n"
    assert relay.feed(first[:30]) == b""
    released = relay.feed(first[30:])
    assert released.endswith(b"\n\n") and b'"model":"pub"' in released
    assert not relay.saw_done


def test_crlf_framing_and_spaced_json() -> None:
    relay = SseRelay("tiny", "pub")
    out = relay.feed(b'data: {"model": "tiny", "x": 1}\r\n\r\ndata: [DONE]\r\n\r\n')
    assert out == b'data: {"model": "pub", "x": 1}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert relay.saw_done


def test_same_name_passes_bytes_through_untouched() -> None:
    relay = SseRelay("m", "m")
    assert relay.feed(b'data: {"model":"m"}\n\n') == b'data: {"model":"m"}\n\n'


def test_served_names_with_quotes_are_escaped_like_json() -> None:
    relay = SseRelay('we"ird', "pub")
    assert relay.feed(b'data: {"model":"we\\"ird"}\n\n') == b'data: {"model":"pub"}\n\n'


def test_unterminated_tail_is_flushed_as_an_event() -> None:
    relay = SseRelay("tiny", "pub")
    assert relay.feed(b'data: {"model":"tiny"}') == b""
    assert relay.flush() == b'data: {"model":"pub"}\n\n'
    assert relay.flush() == b""


def test_error_event_ends_with_done() -> None:
    assert error_event(b'{"error":{}}') == b'data: {"error":{}}\n\ndata: [DONE]\n\n'


def test_done_inside_generated_text_is_not_the_end() -> None:
    relay = SseRelay("tiny", "pub")
    relay.feed(b'data: {"choices":[{"delta":{"content":"data: [DONE]\\n\\ndata: [DONE]"}}]}\n\n')
    assert not relay.saw_done
    relay.feed(b"data: [DONE]\n\n")
    assert relay.saw_done


def test_responses_api_streams_end_with_response_completed() -> None:
    from gateway.upstream.sse import RESPONSES_END

    relay = SseRelay("tiny", "pub", RESPONSES_END)
    out = relay.feed(b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n')
    assert out and not relay.saw_done
    relay.feed(b'event: response.completed\ndata: {"type":"response.completed","response":{"model":"tiny"}}\n\n')
    assert relay.saw_done

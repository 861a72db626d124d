"""Find the usage in an OpenAI SSE stream without parsing every chunk, and strip it on demand.

Chat and completions streams: the gateway asks vLLM for ``stream_options.include_usage``; vLLM then
sends one last event before ``[DONE]`` with ``"choices":[],"usage":{...}``. Only output that contains
that byte pattern is looked at (a substring search; JSON strings escape quotes, so generated text
cannot forge it), only that event is parsed, and it is cut out again when the client did not ask for
it: every other byte goes to the client as vLLM sent it. Responses streams: the usage is in the
``response.completed`` / ``response.incomplete`` event, which is parsed, never stripped.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.ratelimit.estimate import usage_tokens

_CHAT_MARK = b'"choices":[],"usage":{'
_RESPONSES_MARKS = (b'"type":"response.completed"', b'"type":"response.incomplete"', b'"type":"response.failed"')


def _event_bounds(out: bytes, at: int) -> tuple[int, int]:
    """Start and end (past its blank line) of the event around index ``at``; LF or CRLF framing."""
    lf, crlf = out.rfind(b"\n\n", 0, at), out.rfind(b"\r\n\r\n", 0, at)
    start = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    lf, crlf = out.find(b"\n\n", at), out.find(b"\r\n\r\n", at)
    ends = ([lf + 2] if lf >= 0 else []) + ([crlf + 4] if crlf >= 0 else [])
    return start, min(ends) if ends else len(out)


def _data_json(event: bytes) -> Any:
    parts = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    try:
        return orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError:
        return None


class UsageTap:
    """Watches the relayed output of one stream. ``strip``: remove the usage event (chat/completions)."""

    __slots__ = ("_responses", "strip", "usage")

    def __init__(self, kind: str, strip: bool) -> None:
        self._responses = kind == "responses"
        self.strip = strip and not self._responses
        self.usage: tuple[int, int] | None = None

    def scan(self, out: bytes) -> bytes:
        if self._responses:
            for mark in _RESPONSES_MARKS:
                at = out.find(mark)
                if at >= 0:
                    start, end = _event_bounds(out, at)
                    data = _data_json(out[start:end])
                    if isinstance(data, dict) and isinstance(data.get("response"), dict):
                        self.usage = usage_tokens(data["response"].get("usage")) or self.usage
                    break
            return out
        at = out.find(_CHAT_MARK)
        if at < 0:
            return out
        start, end = _event_bounds(out, at)
        data = _data_json(out[start:end])
        if isinstance(data, dict):
            self.usage = usage_tokens(data.get("usage")) or self.usage
        if self.strip:
            return out[:start] + out[end:]
        return out


def ask_for_usage(payload: dict[str, Any]) -> bool:
    """Make an OpenAI chat/completions stream request ask for the usage chunk.

    True when the client asked for it itself (so it must be relayed), False when the gateway added it.
    """
    opts = payload.get("stream_options")
    if isinstance(opts, dict):
        if opts.get("include_usage") is True:
            return True
        payload["stream_options"] = {**opts, "include_usage": True}
        return False
    if opts is None:
        payload["stream_options"] = {"include_usage": True}
        return False
    return True  # something vLLM will reject as the client sent it: leave it alone

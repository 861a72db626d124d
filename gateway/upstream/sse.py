"""Relay an upstream SSE byte stream without parsing its JSON.

:class:`SseRelay` cuts the byte stream at event boundaries (a blank line, LF or CRLF framing) so
that a rewrite never sees half an event, rewrites the ``"model":"<served>"`` field to the public ID
with a byte substitution, and notes whether ``data: [DONE]`` went by. Every complete event is
released as soon as its last byte arrives: nothing is held back beyond an incomplete event.
"""

from __future__ import annotations

import orjson

DONE = b"data: [DONE]"
# How a complete stream ends. A JSON string escapes newlines and quotes, so these byte patterns cannot
# come from generated text: ``\ndata: [DONE]`` starts a line, ``"type":"..."`` is unescaped JSON.
CHAT_END: tuple[bytes, ...] = (b"\n" + DONE,)
RESPONSES_END: tuple[bytes, ...] = (
    b'"type":"response.completed"', b'"type":"response.failed"', b'"type":"response.incomplete"',
    b"\n" + DONE,
)


def error_event(body: bytes) -> bytes:
    """An SSE error event the openai SDK turns into ``APIError``, followed by ``[DONE]``."""
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"


def _boundary(buf: bytes) -> int:
    """Index just past the last event terminator in ``buf``, or -1."""
    if buf.endswith(b"\n\n"):  # the common read: whole events (no terminator can end later)
        return len(buf)
    end = -1
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.rfind(sep)
        if i >= 0 and i + len(sep) > end:
            end = i + len(sep)
    return end


class SseRelay:
    __slots__ = ("_buf", "_ends", "_pairs", "events_out", "saw_done")

    def __init__(self, served_name: str, public_id: str, ends: tuple[bytes, ...] = CHAT_END) -> None:
        self._buf = b""
        self._ends = ends
        self.saw_done = False
        self.events_out = 0
        if served_name == public_id:
            self._pairs: tuple[tuple[bytes, bytes], ...] = ()
        else:
            s, p = orjson.dumps(served_name), orjson.dumps(public_id)
            self._pairs = ((b'"model":' + s, b'"model":' + p), (b'"model": ' + s, b'"model": ' + p))

    def feed(self, chunk: bytes) -> bytes:
        """Bytes that may go to the client now (complete events only)."""
        buf = self._buf + chunk if self._buf else chunk
        end = _boundary(buf)
        if end < 0:  # no complete event yet
            self._buf = buf
            return b""
        out, self._buf = buf[:end], buf[end:]
        return self._emit(out)

    def flush(self) -> bytes:
        """Whatever is left when the upstream ended (an event without its blank line)."""
        out, self._buf = self._buf, b""
        if not out.strip():
            return b""
        return self._emit(out + b"\n\n")

    def _emit(self, out: bytes) -> bytes:
        for old, new in self._pairs:
            if old in out:
                out = out.replace(old, new)
        if not self.saw_done:
            if out.startswith(DONE):
                self.saw_done = True
            else:
                for e in self._ends:
                    if e in out:
                        self.saw_done = True
                        break
        self.events_out += 1
        return out

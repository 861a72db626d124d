"""Read and check a proxied request body: bounded, parsed once, the fields routing needs."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from gateway.api.encoding import decode_body
from gateway.api.routes import ProxyRoute
from gateway.errors import InvalidRequest, PayloadTooLarge

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

# orjson reads integers outside [-2**63, 2**64) as floats: refused here rather than sent on rounded.
# (Nesting orjson reads but cannot write again is refused where the body is re-serialised:
# gateway.upstream.forward.encode_payload.)
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19  # the shortest run of digits that can be outside orjson's integer range
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1

_TYPE_NAMES = {str: "a string", list: "an array", dict: "an object", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}


def _json_type(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


async def read_body(headers: list[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes:
    coding: bytes | None = None
    for k, v in headers:
        if k == b"content-length":
            try:
                declared = int(v)
            except ValueError:
                raise InvalidRequest("Invalid Content-Length header.") from None
            if declared > limit:
                raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
        elif k == b"content-encoding":
            coding = v if coding is None else coding + b"," + v
    body = await _receive_body(receive, limit)
    if coding is not None:
        return decode_body(body, coding.decode("latin-1"), limit)
    return body


async def _receive_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("The client disconnected while sending the body.")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")
            parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts) if len(parts) != 1 else parts[0]


def parse_payload(body: bytes, route: ProxyRoute) -> dict[str, Any]:
    if not body.strip():
        raise InvalidRequest(
            "The request body is empty. Send a JSON object with at least `model`.", code="invalid_json"
        )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request ({exc}). Send valid JSON with "
            f"Content-Type: application/json.",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            f"The request body must be a JSON object, not {_json_type(data)}.", code="invalid_json"
        )
    _check_representable(body)
    fields: list[tuple[str, type | tuple[type, ...], str]] = [("model", str, "a string"), *route.required]
    for name, types, description in fields:
        if name not in data or data[name] is None:
            raise InvalidRequest(
                f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
            )
        if not isinstance(data[name], types):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected {description}, but got {_json_type(data[name])} instead.",
                param=name, code="invalid_type",
            )
    if not data["model"]:
        raise InvalidRequest("Invalid value for 'model': it must not be empty.", param="model",
                             code="invalid_value")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest(
            f"Invalid type for 'stream': expected a boolean, but got {_json_type(stream)} instead.",
            param="stream", code="invalid_type",
        )
    return data


def _too_large(literal: str) -> int:
    value = int(literal)
    if not _INT_MIN <= value <= _INT_MAX:
        raise InvalidRequest(
            f"The integer {literal[:40]}{'...' if len(literal) > 40 else ''} is out of range: integers in the "
            f"request body must lie between -2**63 and 2**64-1.",
            code="invalid_json",
        )
    return value


def _check_representable(body: bytes) -> None:
    """Refuse integer literals orjson would have turned into floats.

    One ``bytes.translate`` and one substring search (about 2 ns per byte); the slow exact check
    (the standard library's parser, integer literals only) runs only for a body with a 19-digit run.
    """
    if _LONG_DIGITS in body.translate(_DIGITS):
        try:
            json.loads(body, parse_int=_too_large)  # integer literals only; digits inside strings pass
        except (ValueError, RecursionError):  # orjson accepted it; nothing more to say
            pass

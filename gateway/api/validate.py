"""Read and check a proxied request body: bounded, parsed once, the fields routing needs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from gateway.api.routes import ProxyRoute
from gateway.errors import InvalidRequest, PayloadTooLarge

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

_TYPE_NAMES = {str: "a string", list: "an array", dict: "an object", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}


def _json_type(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


async def read_body(headers: list[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes:
    for k, v in headers:
        if k == b"content-length":
            try:
                declared = int(v)
            except ValueError:
                raise InvalidRequest("Invalid Content-Length header.") from None
            if declared > limit:
                raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
            break
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

from __future__ import annotations

import logging

import orjson

from gateway.observability.logging import JsonFormatter, redact


def test_redact_bearer_tokens_and_sk_keys() -> None:
    assert redact("Authorization: Bearer abc.def-123") == "Authorization: Bearer [REDACTED]"
    assert redact("key sk-live-0123456789 leaked") == "key [REDACTED] leaked"
    assert redact("nothing secret here") == "nothing secret here"


def test_json_lines_carry_extras_and_are_redacted() -> None:
    record = logging.LogRecord("gateway.access", logging.INFO, __file__, 1, "got %s", ("Bearer sk-abcdef123",),
                               None)
    record.request_id = "r1"
    record.upstream = "gpu0 with sk-secret-value-1"
    line = orjson.loads(JsonFormatter().format(record))
    assert line["msg"] == "got Bearer [REDACTED]"
    assert line["request_id"] == "r1" and line["level"] == "info" and line["logger"] == "gateway.access"
    assert "sk-secret" not in line["upstream"]

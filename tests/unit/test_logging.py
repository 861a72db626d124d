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


def test_text_lines_escape_control_characters() -> None:
    from gateway.observability.logging import TextFormatter, escape_controls

    assert escape_controls("a\nb\r\x1b[31m\x00\x7f\x85z") == "a\\x0ab\\x0d\\x1b[31m\\x00\\x7f\\x85z"
    record = logging.LogRecord("gateway.access", logging.INFO, __file__, 1, "%s %s %s", (
        "GET", "/v1/x\n2026-01-01 00:00:00,000 INFO gateway.access: POST /admin 200\x1b[2J", 404), None)
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith("GET /v1/x\\x0a2026-01-01 00:00:00,000 INFO gateway.access: POST /admin 200\\x1b[2J 404")


def test_text_tracebacks_keep_lines_that_cannot_pass_for_log_lines() -> None:
    import sys

    from gateway.observability.logging import TextFormatter

    try:
        raise ValueError("bad\n2026-01-01 00:00:00,000 INFO forged\x1b[31m")
    except ValueError:
        record = logging.LogRecord("gateway.api", logging.ERROR, __file__, 1, "oops", (), sys.exc_info())
    lines = TextFormatter().format(record).split("\n")
    assert lines[0].endswith("oops") and lines[1].startswith("Traceback")
    assert all(line.startswith("  | ") for line in lines[2:]) and "\x1b" not in "".join(lines)

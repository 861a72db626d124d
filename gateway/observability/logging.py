"""Structured logs (one JSON object per line) with secrets scrubbed from every message."""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import orjson

_SECRET = re.compile(r"(?i)(bearer\s+)[^\s\"',]+|\bsk-[A-Za-z0-9_\-]{6,}")
_STD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def redact(text: str) -> str:
    return _SECRET.sub(lambda m: (m.group(1) or "") + "[REDACTED]", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for k, v in record.__dict__.items():
            if k not in _STD and not k.startswith("_"):
                out[k] = redact(v) if isinstance(v, str) else v
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(out, default=str).decode()


# C0 and C1 control characters and DEL: a client's %0a in a path must not start a forged log line,
# nor an ESC reach the operator's terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _escape_char(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def escape_controls(text: str) -> str:
    """``a\nb`` -> ``a\\x0ab``: one log line stays one line, whatever a client sent."""
    return _CONTROL.sub(_escape_char, text)


def _escape_block(text: str) -> str:
    # A traceback keeps its lines, each continuation marked so none can pass for a log line.
    return _CONTROL_BUT_NEWLINE.sub(_escape_char, text).replace("\n", "\n  | ")


class TextFormatter(logging.Formatter):
    """One line per record: the message has its control characters escaped; a traceback's
    continuation lines start with ``  | ``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return _escape_block(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _escape_block(super().formatStack(stack_info))

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)

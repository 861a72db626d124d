"""``gateway usage [--key K] [--days N] [--json]``: per-key, per-model usage from Redis."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import asdict
from typing import Any

import orjson
from redis.exceptions import RedisError

from gateway.accounting import UsageRow
from gateway.config import ConfigError, load_config
from gateway.ratelimit.usage import RedisUsageReader
from gateway.redis_client import connect
from gateway.settings import Settings

_COLUMNS = ("day", "key", "model", "requests", "prompt_tokens", "completion_tokens", "rate_limited")


def render_table(rows: list[UsageRow]) -> str:
    table = [_COLUMNS] + [tuple(str(getattr(r, c)) for c in _COLUMNS) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_COLUMNS))]
    lines = []
    for row in table:
        cells = [v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    total = [sum(getattr(r, c) for r in rows) for c in _COLUMNS[3:]]
    lines.append("total: " + ", ".join(f"{c} {v}" for c, v in zip(_COLUMNS[3:], total, strict=True)))
    return "\n".join(lines)


async def _read(url: str, key_names: list[str], days: int, key: str | None) -> list[UsageRow]:
    client = connect(url, 10.0)
    try:
        return await RedisUsageReader(client, lambda: key_names).usage(days, key)
    finally:
        await client.aclose()


def _cmd_usage(args: argparse.Namespace) -> int:
    settings = Settings(**({"config": args.config} if args.config else {}))
    if not settings.redis_url:
        print("gateway usage: usage is recorded in Redis; set GATEWAY_REDIS_URL (the gateway's own value)",
              file=sys.stderr)
        return 2
    try:
        config = load_config(settings.config, os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    names = [k.name for k in config.keys]
    if args.key is not None and args.key not in names:
        print(f"gateway usage: no key named {args.key!r} in {settings.config}", file=sys.stderr)
        return 2
    try:
        rows = asyncio.run(_read(settings.redis_url, names, args.days, args.key))
    except (RedisError, OSError) as exc:
        print(f"gateway usage: cannot read Redis: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out: list[dict[str, Any]] = [asdict(r) for r in rows]
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render_table(rows))
    return 0


def register(sub: Any) -> None:
    u = sub.add_parser("usage", help="tokens and requests per key and model, per UTC day (from Redis)")
    u.add_argument("--config", help="config file, for the key names (env GATEWAY_CONFIG)")
    u.add_argument("--key", help="only this key")
    u.add_argument("--days", type=int, default=7, help="the last N UTC days, today included (default 7)")
    u.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    u.set_defaults(func=_cmd_usage)

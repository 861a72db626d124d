"""The ``gateway`` command: the only place that reads argv and the environment."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence

from gateway.auth.keys import new_key
from gateway.config import ConfigError, load_config
from gateway.settings import Settings


def _cmd_serve(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in {
        "config": args.config, "host": args.host, "port": args.port, "workers": args.workers,
    }.items() if v is not None}
    settings = Settings(**overrides)
    try:
        config = load_config(settings.config, os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from gateway.server import run_server

    return run_server(settings, config)


def _cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    n_up = sum(len(m.upstreams) for m in config.models)
    n_lim = sum(1 for k in config.keys if k.limited() or k.per_model) + sum(1 for m in config.models if m.limited())
    limited = f", {n_lim} with rate limits" if n_lim else ""
    print(f"{args.file}: OK ({len(config.models)} models, {n_up} upstreams, {len(config.keys)} keys{limited})")
    scraped = 0
    for m in config.models:
        if m.routing == "weighted" and m.affinity is None and m.shed is None:
            continue
        parts: list[str] = [m.routing]
        if m.affinity is not None:
            parts.append(f"affinity {m.affinity}")
        if m.shed is not None:
            parts.append("shed " + " ".join(f"{k}={v:g}" for k, v in
                                            (("max_waiting", m.shed.max_waiting),
                                             ("max_kv_usage", m.shed.max_kv_usage)) if v is not None))
        if m.routing == "load_aware" or m.shed is not None:
            scraped += len(m.upstreams)
        print(f"  model {m.id}: {', '.join(parts)}")
    if scraped:
        r = config.routing
        print(f"  /metrics of {scraped} upstreams scraped every {r.metrics_interval_s:g}s "
              f"(older than {r.metrics_stale_s:g}s: saturated)")
    return 0


def _cmd_keys_new(args: argparse.Namespace) -> int:
    key = new_key()
    digest = hashlib.sha256(key.encode()).hexdigest()
    print(f"key (give it to {args.name}; it is shown only once):\n  {key}\n")
    print("config entry (keys:):")
    print(f"  - name: {args.name}\n    key_sha256: \"{digest}\"\n    models: [\"*\"]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway", description="OpenAI-compatible gateway for vLLM backends")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", help="config file (env GATEWAY_CONFIG; default config/gateway.yaml)")
    s.add_argument("--host", help="listen address (env GATEWAY_HOST; default 127.0.0.1)")
    s.add_argument("--port", type=int, help="listen port (env GATEWAY_PORT; default 8080)")
    s.add_argument("--workers", type=int, help="worker processes (env GATEWAY_WORKERS; default 1)")
    s.set_defaults(func=_cmd_serve)

    c = sub.add_parser("check-config", help="validate a config file and print what is wrong")
    c.add_argument("file")
    c.set_defaults(func=_cmd_check_config)

    k = sub.add_parser("keys", help="client key tools")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    kn = ksub.add_parser("new", help="print a fresh client key and its config line (SHA-256)")
    kn.add_argument("--name", required=True)
    kn.set_defaults(func=_cmd_keys_new)

    from gateway.launch import backends_cli, doctor_cli
    from gateway.loadtool import cli as loadtool_cli
    from gateway.ratelimit import usage_cli

    backends_cli.register(sub)
    doctor_cli.register(sub)
    loadtool_cli.register(sub)
    usage_cli.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc

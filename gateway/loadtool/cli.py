"""`gateway loadtest`: argv -> a bounded load -> live progress, summary, verdict, optional JSON/HTML files.

Exit status: 0 PASS, 1 FAIL (success rate under --min-success or average latency over
--max-avg-latency), 2 bad arguments or unwritable output, 130 interrupted by Ctrl-C (after the
partial summary and files).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console

from gateway.loadtool.client import RequestResult, Sender, Target, normalise_base_url
from gateway.loadtool.html import render_page
from gateway.loadtool.protocol import APIS, RequestSpec, make_api
from gateway.loadtool.report import LiveCounts, LiveProgress, print_report
from gateway.loadtool.runner import Plan, RunRecord, run_load
from gateway.loadtool.stats import Criteria, Summary, Verdict, judge, ratios, summarize

DEFAULT_REQUESTS = 64
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
# Short, common English words: about one token each in the usual tokenizers.
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far", "away",
          "from", "home", "to", "see", "what", "is", "new")  # fmt: skip


def parse_duration(text: str) -> float:
    """`60s`, `2m`, `500ms`, `1h`, or plain seconds (`1.5`)."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 60s, 2m, 500ms)")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be positive")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 0 and 1")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def prompt_of(tokens: int) -> str:
    """A prompt of about `tokens` tokens (one short common word per token)."""
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(tokens))


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "loadtest",
        help="send a bounded load to an OpenAI/Anthropic endpoint and judge it (PASS/FAIL)",
        description="Send a bounded load (a request count or a duration) to a deployment, show live progress, "
        "then a summary (success rate, status counts, errors by type, latency and time-to-first-token "
        "percentiles, output tokens/s) and a PASS/FAIL verdict. Exit status: 0 PASS, 1 FAIL, 2 bad arguments, "
        "130 interrupted (Ctrl-C prints the partial summary). See docs/loadtest.md.",
    )
    p.add_argument("--base-url", required=True, help="the endpoint, with or without /v1 (e.g. http://127.0.0.1:8080)")
    p.add_argument("--key", default=os.environ.get("LOADTEST_KEY"),
                   help="API key (default: env LOADTEST_KEY; a key in argv is visible to other users of the host)")
    p.add_argument("--model", required=True, help="model id to request")
    p.add_argument("-c", "--concurrency", type=_positive_int, default=16, help="requests in flight (default 16)")
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("-n", "--requests", type=_positive_int,
                       help=f"requests per endpoint (default {DEFAULT_REQUESTS} unless --duration)")
    bound.add_argument("--duration", type=parse_duration, help="run this long instead (60s, 2m); in-flight "
                       "requests finish, each bounded by --timeout")
    p.add_argument("--stream", action="store_true", help="streaming requests (measures time to first token)")
    p.add_argument("--max-tokens", type=_positive_int, default=64, help="max_tokens per request (default 64)")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="the user message (default: about 32 tokens of words)")
    prompt.add_argument("--prompt-tokens", type=_positive_int, help="a generated user message of about N tokens")
    p.add_argument("--api", choices=APIS, default="openai",
                   help="openai: POST /v1/chat/completions (Bearer); anthropic: POST /v1/messages (x-api-key)")
    p.add_argument("--bearer", action="store_true", help="with --api anthropic, also send Authorization: Bearer "
                   "(vLLM's own /v1/messages checks only that)")
    p.add_argument("--timeout", type=parse_duration, default=120.0, help="per request, whole answer (default 120s)")
    p.add_argument("--min-success", type=_fraction, default=0.95, help="PASS needs this success rate (default 0.95)")
    p.add_argument("--max-avg-latency", type=parse_duration, default=5.0,
                   help="PASS needs the average latency of successful requests at most this (default 5s)")
    p.add_argument("--compare", metavar="URL2", help="run the same load against a second endpoint, alternating rounds")
    p.add_argument("--compare-key", help="key for URL2 (default: --key)")
    p.add_argument("--compare-model", help="model for URL2 (default: --model)")
    p.add_argument("--round-size", type=_positive_int,
                   help="requests per round when comparing (default: max(concurrency, requests/8))")
    p.add_argument("--json", metavar="FILE", help="write the summary and every request's numbers as JSON")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report with charts")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class LoadConfig:
    targets: list[Target]
    plan: Plan
    spec: RequestSpec
    api: str
    bearer: bool
    timeout_s: float
    criteria: Criteria
    json_path: Path | None
    html_path: Path | None
    progress: bool
    command: str


def build_config(args: argparse.Namespace) -> LoadConfig:
    """Validate the arguments; ValueError with a message for the user."""
    if not args.key:
        raise ValueError("no key: pass --key or set LOADTEST_KEY")
    targets = [Target("target", normalise_base_url(args.base_url), args.key, args.model)]
    if args.compare:
        targets[0] = Target("A", targets[0].base_url, args.key, args.model)
        targets.append(Target("B", normalise_base_url(args.compare), args.compare_key or args.key,
                              args.compare_model or args.model))
    elif args.compare_key or args.compare_model or args.round_size:
        raise ValueError("--compare-key, --compare-model and --round-size need --compare")
    requests = None if args.duration is not None else (args.requests or DEFAULT_REQUESTS)
    plan = Plan(concurrency=args.concurrency, requests=requests, duration_s=args.duration, round_size=args.round_size)
    text = args.prompt if args.prompt is not None else prompt_of(args.prompt_tokens or 32)
    bound = f"-n {requests}" if requests is not None else f"--duration {args.duration:g}s"
    command = (f"gateway loadtest --api {args.api} --base-url {targets[0].base_url} --model {args.model} "
               f"-c {args.concurrency} {bound} --max-tokens {args.max_tokens}{' --stream' if args.stream else ''}"
               + (f" --compare {targets[1].base_url} --compare-model {targets[1].model}" if args.compare else ""))
    for path in (args.json, args.html):
        if path and not Path(path).resolve().parent.is_dir():
            raise ValueError(f"{path}: its directory does not exist")
    return LoadConfig(
        targets=targets, plan=plan, spec=RequestSpec(args.model, text, args.max_tokens, args.stream), api=args.api,
        bearer=args.bearer, timeout_s=args.timeout, criteria=Criteria(args.min_success, args.max_avg_latency),
        json_path=Path(args.json) if args.json else None, html_path=Path(args.html) if args.html else None,
        progress=not args.no_progress, command=command,
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
    except ValueError as exc:
        print(f"gateway loadtest: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_main(config))


async def _main(config: LoadConfig) -> int:
    out = Console(width=None if sys.stdout.isatty() else 140, highlight=False)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 140, highlight=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C ends the program at once

    loop.add_signal_handler(signal.SIGINT, interrupted)
    api = make_api(config.api, bearer=config.bearer)
    limits = httpx.Limits(max_connections=config.plan.concurrency,
                          max_keepalive_connections=config.plan.concurrency)
    clients = [httpx.AsyncClient(limits=limits, trust_env=False, timeout=httpx.Timeout(config.timeout_s))
               for _ in config.targets]
    zero = time.perf_counter()
    senders = [Sender(clients[i], i, t, api, api.body(RequestSpec(t.model, config.spec.prompt, config.spec.max_tokens,
                                                                   config.spec.stream)),
                      config.spec.stream, config.timeout_s, zero) for i, t in enumerate(config.targets)]
    total = config.plan.requests * len(senders) if config.plan.requests is not None else None
    counts = LiveCounts(total, config.plan.duration_s)
    try:
        if config.progress:
            with LiveProgress(err, counts, "loadtest"):
                record = await run_load(senders, config.plan, stop, counts.add, zero)
        else:
            record = await run_load(senders, config.plan, stop, counts.add, zero)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
    return _finish(config, record, out)


def _finish(config: LoadConfig, record: RunRecord, out: Console) -> int:
    summaries = [summarize(t, [r for r in record.results if r.target == i], record.active_s[i])
                 for i, t in enumerate(config.targets)]
    rat = ratios(summaries[0], summaries[1]) if len(summaries) > 1 else None
    verdict = judge(summaries[0], config.criteria)
    print_report(out, summaries, rat, verdict, stream=config.spec.stream, interrupted=record.interrupted,
                 elapsed_s=record.elapsed_s)
    try:
        if config.json_path:
            config.json_path.write_bytes(orjson.dumps(_json_doc(config, record, summaries, rat, verdict),
                                                      option=orjson.OPT_INDENT_2))
            out.print(f"JSON written to {config.json_path}")
        if config.html_path:
            page = render_page(title="gateway loadtest", command=config.command, summaries=summaries, ratios=rat,
                               verdict=verdict, results=record.results, stream=config.spec.stream,
                               elapsed_s=record.elapsed_s, interrupted=record.interrupted)
            config.html_path.write_text(page, encoding="utf-8")
            out.print(f"HTML report written to {config.html_path}")
    except OSError as exc:
        print(f"gateway loadtest: cannot write a report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if record.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_PASS if verdict.passed else EXIT_FAIL


def _json_doc(config: LoadConfig, record: RunRecord, summaries: list[Summary], rat: dict[str, float | None] | None,
              verdict: Verdict) -> dict[str, Any]:  # fmt: skip
    def request(r: RequestResult) -> dict[str, Any]:
        d = asdict(r)
        d["target"] = config.targets[r.target].name
        return d

    return {
        "command": config.command,
        "api": config.api,
        "stream": config.spec.stream,
        "concurrency": config.plan.concurrency,
        "requests_per_target": config.plan.requests,
        "duration_s": config.plan.duration_s,
        "max_tokens": config.spec.max_tokens,
        "criteria": asdict(config.criteria),
        "interrupted": record.interrupted,
        "elapsed_s": record.elapsed_s,
        "verdict": {"passed": verdict.passed, "label": verdict.label, "detail": verdict.detail,
                    "reasons": verdict.reasons},
        "targets": [s.to_dict() for s in summaries],
        "ratios": rat,
        "requests": [request(r) for r in record.results],
    }

"""What a run prints and saves: per-case rows, the gateway's cost as ratios, machine facts, JSON helpers."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.bench.loadgen import RunResult
from loadtest.bench.scenarios import Case

ROOT = Path(__file__).resolve().parents[2]
PROXIES = ("nginx", "floor", "gateway")
HEADER = (f"{'case':<4} {'target':<11} {'conc':>4} {'req/s':>9} {'p50':>7} {'p99':>7} {'ttfb50':>7} "
          f"{'ttfb99':>7} {'err':>4}  cpu ms/req: proxy client stub")
# The targets, per case: (what, test on gateway value g and floor value f)
GOALS: dict[str, tuple[str, Any]] = {
    "A": ("<= floor + 0.05 ms", lambda g, f: g <= f + 0.05),
    "B": (">= 0.85 x floor", lambda g, f: g >= 0.85 * f),
    "B-cpu": ("<= 1.15 x floor", lambda g, f: g <= 1.15 * f),
    "C": (">= 0.9 x floor", lambda g, f: g >= 0.9 * f),
    "D": ("<= 1.5 x floor", lambda g, f: g <= 1.5 * f),
    "E": ("0 errors", lambda g, _f: g == 0),
}
_NO_FLOOR_NEEDED = {"E"}  # goals judged on the gateway's number alone


def _f(x: float | None, w: int = 7, d: int = 2) -> str:
    return f"{'-':>{w}}" if x is None or x != x else f"{x:>{w}.{d}f}"


def print_rows(case: Case, rows: Sequence[RunResult]) -> None:
    for r in rows:
        cpu = " ".join(_f(r.cpu_ms_per_req.get(k), 0, 3) if k in r.cpu_ms_per_req else "-"
                       for k in ("proxy", "client", "stub"))
        ttfb = r.ttfb_ms or {}
        print(f"{case.name:<4} {r.target:<11} {r.concurrency:>4} {r.rps:>9.1f} {_f(r.latency_ms['p50'])} "
              f"{_f(r.latency_ms['p99'])} {_f(ttfb.get('p50'))} {_f(ttfb.get('p99'))} {r.errors:>4}  {cpu}",
              flush=True)
        if r.first_error:
            print(f"     first error: {r.first_error}", flush=True)


def case_summary(case: Case, rows: Sequence[RunResult]) -> list[dict[str, Any]]:
    """The case's number per target, and the gateway's as a ratio to direct, nginx and the floor."""
    by = {r.target: r for r in rows}
    direct = by["direct"]

    def value(r: RunResult) -> float | None:
        if case.metric == "added_p50_ms":
            return r.latency_ms["p50"] - (0.0 if r is direct else direct.latency_ms["p50"])
        if case.metric == "rps":
            return r.rps
        if case.metric == "chunks_per_s":
            return r.rps * case.tokens
        if case.metric == "errors":
            return float(r.errors)
        if r.ttfb_ms is None or direct.ttfb_ms is None:
            return None
        return r.ttfb_ms["p99"] - (0.0 if r is direct else direct.ttfb_ms["p99"])

    out = [_line(case.name, case.metric, {name: value(r) for name, r in by.items()},
                 case.metric not in ("rps", "chunks_per_s", "errors"))]
    if case.metric == "rps":
        cpu = {name: r.cpu_ms_per_req.get("proxy") for name, r in by.items() if name != "direct"}
        out.append(_line("B-cpu" if case.name == "B" else f"{case.name}-cpu", "proxy_cpu_ms_per_req", cpu, True))
    return out


def _line(name: str, metric: str, values: dict[str, float | None], added: bool) -> dict[str, Any]:
    g = values.get("gateway")

    def ratio(other: str) -> float | None:
        o = values.get(other)
        if g is None or o is None or o == 0 or (added and (other == "direct" or o < 0)):
            return None  # an added time below zero (noise) has no meaningful ratio
        return g / o

    goal = GOALS.get(name)
    f = values.get("floor")
    met = goal[1](g, f) if goal and g is not None and (f is not None or name in _NO_FLOOR_NEEDED) else None
    return {"case": name, "metric": metric, "values": values,
            "gateway_ratio": {o: ratio(o) for o in ("direct", "nginx", "floor") if o in values},
            "goal": goal[0] if goal else None, "met": met}


def print_summary(lines: Sequence[dict[str, Any]], targets: Sequence[str]) -> None:
    print("\nThe gateway's cost (added = target minus direct, same run; ratios = gateway / other):")
    head = f"{'case':<6} {'metric':<22}" + "".join(f"{t:>13}" for t in targets)
    head += "".join(f"{'gw/' + o:>11}" for o in ("direct", "nginx", "floor")) + "   goal"
    print(head)
    for line in lines:
        vals = "".join(_f(line["values"].get(t), 13, 3 if "ms" in line["metric"] else 1) for t in targets)
        rat = "".join(_f(line["gateway_ratio"].get(o), 11, 2) for o in ("direct", "nginx", "floor"))
        met = "" if line["met"] is None else (" met" if line["met"] else " NOT met")
        print(f"{line['case']:<6} {line['metric']:<22}{vals}{rat}   {line['goal'] or ''}{met}")


def print_profile(p: dict[str, Any]) -> None:
    r = p["run"]
    print(f"\nprofile: {p['samples']} samples -> {p['file']} ({r['scenario']} load under py-spy: {r['rps']} req/s, "
          f"p50 {r['latency_ms']['p50']:.2f} ms, gateway CPU {r['cpu_ms_per_req'].get('gateway', 0):.3f} ms/req)")
    for key, title, n in (
        ("gateway_self", "cost charged to the innermost gateway frame (incl. the library calls it makes)", 12),
        ("gateway_calls", "... split by the library function it called", 12),
        ("library_inclusive", "library frames below the innermost gateway frame, inclusive", 20),
        ("self", "innermost frame (any code)", 12),
    ):
        print(f"  {title}:")
        for row in p[key][:n]:
            print(f"    {row['pct']:5.1f}%  {row['frame']}")


def _finite(x: Any) -> Any:
    """NaN (no samples) as null, so that the file is strict JSON."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version(), "loadavg_at_start": load}


def git_rev() -> str | None:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "gateway"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}{'+dirty' if dirty else ''}" if rev else None


# Issue 7: what rate limits add to the gateway's CPU per request (same run, ratio to no limits)
LIMIT_GOALS = {"gateway-memlimits": 1.05, "gateway-redislimits": 1.25}


def _spread(xs: Sequence[float]) -> str:
    """min/median/max of the per-round ratios."""
    return f"{min(xs):.2f}/{statistics.median(xs):.2f}/{max(xs):.2f}" if xs else "-"


def limits_summary(case: str, rows: Sequence[RunResult], rounds: dict[str, list[RunResult]]) -> list[dict[str, Any]]:
    """Per limited gateway: CPU per request and req/s as ratios to the gateway without limits, overall
    (all rounds together) and per round (round i against round i of the plain gateway)."""
    by = {r.target: r for r in rows}
    base = by["gateway"]
    out: list[dict[str, Any]] = []
    for name, goal in LIMIT_GOALS.items():
        if name not in by:
            continue
        r = by[name]
        cpu, base_cpu = r.cpu_ms_per_req.get("proxy"), base.cpu_ms_per_req.get("proxy")
        per_cpu = [a.cpu_ms_per_req["proxy"] / b.cpu_ms_per_req["proxy"]
                   for a, b in zip(rounds[name], rounds["gateway"], strict=True)
                   if a.cpu_ms_per_req.get("proxy") and b.cpu_ms_per_req.get("proxy")]
        per_rps = [a.rps / b.rps for a, b in zip(rounds[name], rounds["gateway"], strict=True) if b.rps]
        cpu_ratio = cpu / base_cpu if cpu and base_cpu else None
        out.append({"case": case, "target": name, "cpu_ms_per_req": cpu, "base_cpu_ms_per_req": base_cpu,
                    "cpu_ratio": cpu_ratio, "cpu_ratio_rounds": per_cpu, "rps": r.rps, "base_rps": base.rps,
                    "rps_ratio": r.rps / base.rps if base.rps else None, "rps_ratio_rounds": per_rps,
                    "redis_cpu_ms_per_req": r.cpu_ms_per_req.get("redis"),
                    "goal": f"cpu <= {goal:.2f} x gateway", "met": None if cpu_ratio is None else cpu_ratio <= goal})
    return out


def baseline_summary(case: str, rows: Sequence[RunResult], rounds: dict[str, list[RunResult]],
                     rev: str) -> dict[str, Any]:
    """This checkout's gateway against ``--baseline``'s, same run: CPU per request and req/s ratios,
    overall and per round (round i against round i)."""
    by = {r.target: r for r in rows}
    new, old = by["gateway"], by["gateway-base"]
    cpu, base_cpu = new.cpu_ms_per_req.get("proxy"), old.cpu_ms_per_req.get("proxy")
    per_cpu = [a.cpu_ms_per_req["proxy"] / b.cpu_ms_per_req["proxy"]
               for a, b in zip(rounds["gateway"], rounds["gateway-base"], strict=True)
               if a.cpu_ms_per_req.get("proxy") and b.cpu_ms_per_req.get("proxy")]
    per_rps = [a.rps / b.rps for a, b in zip(rounds["gateway"], rounds["gateway-base"], strict=True) if b.rps]
    return {"case": case, "baseline": rev, "cpu_ms_per_req": cpu, "base_cpu_ms_per_req": base_cpu,
            "cpu_ratio": cpu / base_cpu if cpu and base_cpu else None, "cpu_ratio_rounds": per_cpu,
            "rps_ratio": new.rps / old.rps if old.rps else None, "rps_ratio_rounds": per_rps}


def print_baseline_summary(x: dict[str, Any]) -> None:
    print(f"\nThis gateway against --baseline {x['baseline']} (gateway-base), same run: CPU per request "
          f"{_f(x['cpu_ms_per_req'], 0, 3).strip()} vs {_f(x['base_cpu_ms_per_req'], 0, 3).strip()} ms, ratio "
          f"{_f(x['cpu_ratio'], 0, 3).strip()} (rounds min/med/max {_spread(x['cpu_ratio_rounds'])}); req/s ratio "
          f"{_f(x['rps_ratio'], 0, 3).strip()} ({_spread(x['rps_ratio_rounds'])})", flush=True)


def print_limits_summary(lines: Sequence[dict[str, Any]]) -> None:
    print("\nRate limits' cost (ratio = limited gateway / gateway without limits, same run; per-round min/median/max; "
          "failed: limiter calls that failed open, warm-up included):")
    print(f"{'case':<5} {'target':<20} {'cpu ms/req':>10} {'cpu ratio':>9} {'min/med/max':>14} {'req/s ratio':>11} "
          f"{'min/med/max':>14} {'redis ms/req':>12} {'failed':>6}  goal")
    for x in lines:
        met = "" if x["met"] is None else (" met" if x["met"] else " NOT met")
        print(f"{x['case']:<5} {x['target']:<20} {_f(x['cpu_ms_per_req'], 10, 3)} {_f(x['cpu_ratio'], 9, 3)} "
              f"{_spread(x['cpu_ratio_rounds']):>14} {_f(x['rps_ratio'], 11, 3)} {_spread(x['rps_ratio_rounds']):>14} "
              f"{_f(x['redis_cpu_ms_per_req'] if x['target'].endswith('redislimits') else None, 12, 3)} "
              f"{_f(x.get('limiter_failures_total'), 6, 0)}  "
              f"{x['goal']}{met}", flush=True)

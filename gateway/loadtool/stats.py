"""Results -> numbers: success rate, status counts, errors grouped, percentiles, rates, verdict, ratios.

Latency and TTFT percentiles are over successful requests (a fast 401 would flatter them); the
verdict's average latency likewise. Rates divide by the time the target was under load.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.loadtool.client import RequestResult, Target

NO_ANSWER = "no answer"


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float


@dataclass(frozen=True)
class ErrorGroup:
    kind: str
    count: int
    example: str


@dataclass(frozen=True)
class Summary:
    target: str
    base_url: str
    model: str
    requests: int
    ok: int
    failed: int
    success_rate: float
    status_counts: dict[str, int]
    errors: list[ErrorGroup]
    latency_s: Percentiles | None
    ttft_s: Percentiles | None
    output_tokens: int
    output_tokens_per_s: float | None
    requests_per_s: float | None
    active_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Criteria:
    min_success: float = 0.95
    max_avg_latency_s: float = 5.0


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: list[str]  # why it failed; empty when it passed
    detail: str  # what was checked, e.g. "success rate 100.0% (min 95.0%), average latency 12.3 ms (max 5 s)"

    @property
    def label(self) -> str:
        return "PASS" if self.passed else "FAIL"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `sorted_values` non-empty."""
    if not sorted_values:
        raise ValueError("percentile of nothing")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def percentiles(values: Sequence[float]) -> Percentiles | None:
    if not values:
        return None
    s = sorted(values)
    return Percentiles(p50=percentile(s, 0.5), p90=percentile(s, 0.9), p99=percentile(s, 0.99),
                       mean=sum(s) / len(s), min=s[0], max=s[-1])


def summarize(target: Target, results: Sequence[RequestResult], active_s: float) -> Summary:
    ok = [r for r in results if r.ok]
    statuses = Counter(str(r.status) if r.status is not None else NO_ANSWER for r in results)
    kinds: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for r in results:
        if r.error_kind is not None:
            kinds[r.error_kind] += 1
            examples.setdefault(r.error_kind, r.error_message or "")
    tokens = sum(r.output_tokens or 0 for r in ok)
    has_usage = any(r.output_tokens is not None for r in ok)
    return Summary(
        target=target.name, base_url=target.base_url, model=target.model,
        requests=len(results), ok=len(ok), failed=len(results) - len(ok),
        success_rate=len(ok) / len(results) if results else 0.0,
        status_counts=dict(sorted(statuses.items())),
        errors=[ErrorGroup(kind, n, examples[kind]) for kind, n in kinds.most_common()],
        latency_s=percentiles([r.latency for r in ok]),
        ttft_s=percentiles([r.ttft for r in ok if r.ttft is not None]),
        output_tokens=tokens,
        output_tokens_per_s=tokens / active_s if has_usage and active_s > 0 else None,
        requests_per_s=len(results) / active_s if active_s > 0 else None,
        active_s=active_s,
    )


def judge(summary: Summary, criteria: Criteria) -> Verdict:
    reasons: list[str] = []
    if summary.requests == 0:
        reasons.append("no request completed")
    elif summary.success_rate < criteria.min_success:
        reasons.append(f"success rate {summary.success_rate:.1%} < {criteria.min_success:.1%}")
    if summary.latency_s is None:
        if summary.requests:
            reasons.append("no successful request, so no latency")
    elif summary.latency_s.mean > criteria.max_avg_latency_s:
        reasons.append(f"average latency {summary.latency_s.mean:.3f} s > {criteria.max_avg_latency_s:g} s")
    mean = f"{summary.latency_s.mean * 1000:.1f} ms" if summary.latency_s else "-"
    detail = (f"success rate {summary.success_rate:.1%} (min {criteria.min_success:.1%}), "
              f"average latency {mean} (max {criteria.max_avg_latency_s:g} s)")
    return Verdict(passed=not reasons, reasons=reasons, detail=detail)


def ratios(a: Summary, b: Summary) -> dict[str, float | None]:
    """a / b for each comparable number (latencies: >1 means a is slower; rates: >1 means a is faster)."""

    def div(x: float | None, y: float | None) -> float | None:
        return x / y if x is not None and y else None

    def pct(p: Percentiles | None, name: str) -> float | None:
        return getattr(p, name) if p is not None else None

    out: dict[str, float | None] = {"success_rate": div(a.success_rate, b.success_rate)}
    for name in ("p50", "p90", "p99", "mean"):
        out[f"latency_{name}"] = div(pct(a.latency_s, name), pct(b.latency_s, name))
    for name in ("p50", "p90", "p99"):
        out[f"ttft_{name}"] = div(pct(a.ttft_s, name), pct(b.ttft_s, name))
    out["requests_per_s"] = div(a.requests_per_s, b.requests_per_s)
    out["output_tokens_per_s"] = div(a.output_tokens_per_s, b.output_tokens_per_s)
    return out

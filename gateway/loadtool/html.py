"""One self-contained HTML page for a run: summary, errors and inline SVG charts (no script, no CDN).

Charts: a latency histogram, a time-to-first-token histogram (streams) and requests/s over time,
one colour per target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from gateway.loadtool.client import RequestResult
from gateway.loadtool.stats import Summary, Verdict

COLOURS = ("#2b6cb0", "#dd6b20")
FAIL_COLOURS = ("#c53030", "#805ad5")
W, H = 720, 260
ML, MR, MT, MB = 56, 16, 28, 40  # margins: left, right, top, bottom


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    values: Sequence[float]


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return float(next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw))


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.2g}"


def _frame(title: str, x_min: float, x_max: float, y_max: float, x_label: str, y_label: str) -> list[str]:
    pw, ph = W - ML - MR, H - MT - MB
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'role="img" aria-label="{escape(title)}">',
           f'<text x="{ML}" y="18" class="t">{escape(title)}</text>',
           f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}" class="ax"/>',
           f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}" class="ax"/>']
    step = _nice_step(x_max - x_min)
    x = x_min
    while x <= x_max * 1.0001:
        px = ML + pw * (x - x_min) / (x_max - x_min)
        out.append(f'<text x="{px:.1f}" y="{MT + ph + 16}" class="l" text-anchor="middle">{_fmt(x)}</text>')
        x += step
    step = _nice_step(y_max, 4)
    y = 0.0
    while y <= y_max * 1.0001:
        py = MT + ph - ph * y / y_max
        out.append(f'<line x1="{ML}" y1="{py:.1f}" x2="{ML + pw}" y2="{py:.1f}" class="g"/>')
        out.append(f'<text x="{ML - 6}" y="{py + 4:.1f}" class="l" text-anchor="end">{_fmt(y)}</text>')
        y += step
    out.append(f'<text x="{ML + pw / 2}" y="{H - 6}" class="l" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text x="12" y="{MT + ph / 2}" class="l" transform="rotate(-90 12 {MT + ph / 2})" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    return out


def _legend(series: Sequence[Series]) -> list[str]:
    out = []
    for i, s in enumerate(series):
        x = W - MR - 180
        y = MT + 4 + 16 * i
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{s.colour}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 9}" class="l">{escape(s.name)}</text>')
    return out


def histogram_svg(title: str, series: Sequence[Series], unit_scale: float = 1000.0, unit: str = "ms",
                  bins: int = 30) -> str:  # fmt: skip
    """Bars per bin, targets side by side; values in seconds, shown in `unit`."""
    values = [v * unit_scale for s in series for v in s.values]
    if not values:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} 60" width="{W}" height="60">'
                f'<text x="{ML}" y="30" class="t">{escape(title)}: no data</text></svg>')
    lo, hi = min(values), max(values)
    x_min = 0.0
    if lo > 0.3 * hi:  # a narrow spread far from zero: zoom in, from a round number below it
        step = _nice_step(hi - lo)
        x_min = math.floor(lo / step) * step
    x_max = max(hi * 1.02, x_min + 1e-3)
    width = (x_max - x_min) / bins
    counts = [[0] * bins for _ in series]
    for k, s in enumerate(series):
        for v in s.values:
            counts[k][min(bins - 1, max(0, int((v * unit_scale - x_min) / width)))] += 1
    y_max = max(max(c) for c in counts) * 1.1 or 1.0
    out = _frame(title, x_min, x_max, y_max, unit, "requests")
    pw, ph = W - ML - MR, H - MT - MB
    bar_w = pw / bins / len(series)
    for k, s in enumerate(series):
        for b, n in enumerate(counts[k]):
            if n:
                bh = ph * n / y_max
                x = ML + pw * b / bins + bar_w * k
                out.append(f'<rect x="{x:.1f}" y="{MT + ph - bh:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                           f'height="{bh:.1f}" fill="{s.colour}"><title>{n}</title></rect>')
    out += _legend(series)
    out.append("</svg>")
    return "\n".join(out)


def timeline_svg(title: str, series: Sequence[Series], duration_s: float) -> str:
    """Completions per second over the run: `values` are completion times (s since start), counted in
    buckets of 1 s, or shorter for short runs (about 40 buckets, at least 0.05 s)."""
    span = max(duration_s, 1e-3)
    bucket = 1.0 if span >= 40 else max(0.05, _nice_step(span, 40))
    n = max(1, math.ceil(span / bucket))
    rates = []
    for s in series:
        c = [0] * n
        for t in s.values:
            c[min(n - 1, max(0, int(t / bucket)))] += 1
        rates.append([k / bucket for k in c])
    y_max = max((max(r) for r in rates), default=0) * 1.1 or 1.0
    out = _frame(title, 0.0, n * bucket, y_max, f"seconds since start (buckets of {bucket:g} s)", "requests/s")
    pw, ph = W - ML - MR, H - MT - MB
    for s, r in zip(series, rates, strict=True):
        xy = [(ML + pw * (i + 0.5) / n, MT + ph - ph * v / y_max) for i, v in enumerate(r)]
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{s.colour}" stroke-width="2"/>')
        if n <= 60:
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{s.colour}"/>' for x, y in xy]
    out += _legend(series)
    out.append("</svg>")
    return "\n".join(out)


def _table(summaries: Sequence[Summary], ratios: dict[str, float | None] | None) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    rows: list[tuple[str, list[str], str]] = [
        ("requests", [str(s.requests) for s in summaries], ""),
        ("success rate", [f"{s.success_rate:.1%}" for s in summaries], "success_rate"),
        ("status counts", [", ".join(f"{k}: {v}" for k, v in s.status_counts.items()) for s in summaries], ""),
        ("latency mean", [ms(s.latency_s.mean if s.latency_s else None) for s in summaries], "latency_mean"),
    ]
    for name, attr in (("latency", "latency_s"), ("ttft", "ttft_s")):
        for q in ("p50", "p90", "p99"):
            rows.append((f"{name} {q}", [ms(getattr(getattr(s, attr), q) if getattr(s, attr) else None)
                                         for s in summaries], f"{name}_{q}"))
    rows.append(("requests/s", [f"{s.requests_per_s:.2f}" if s.requests_per_s else "-" for s in summaries],
                 "requests_per_s"))
    rows.append(("output tokens/s", [f"{s.output_tokens_per_s:.1f}" if s.output_tokens_per_s is not None else "-"
                                     for s in summaries], "output_tokens_per_s"))
    head = "".join(f"<th>{escape(s.target)}<br><small>{escape(s.base_url)} ({escape(s.model)})</small></th>"
                   for s in summaries)
    if ratios is not None:
        head += f"<th>{escape(summaries[0].target)} / {escape(summaries[1].target)}</th>"
    body = []
    for label, cells, key in rows:
        extra = ""
        if ratios is not None:
            r = ratios.get(key) if key else None
            extra = f"<td>{'' if not key else '-' if r is None else f'{r:.2f}x'}</td>"
        body.append(f"<tr><th>{escape(label)}</th>{''.join(f'<td>{escape(c)}</td>' for c in cells)}{extra}</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(body)}</table>"


def _errors(summary: Summary) -> str:
    if not summary.errors:
        return ""
    rows = "".join(f"<tr><td>{escape(g.kind)}</td><td>{g.count}</td><td>{escape(g.example)}</td></tr>"
                   for g in summary.errors)
    return (f"<h2>Errors: {escape(summary.target)}</h2>"
            f"<table class=\"errors\"><tr><th>type</th><th>count</th><th>example message</th></tr>{rows}</table>")


CSS = """body{font:14px system-ui,sans-serif;margin:24px;color:#1a202c;max-width:900px}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #cbd5e0;padding:4px 8px;text-align:right}
th{background:#edf2f7}td:last-child{text-align:left}.pass{color:#2f855a}.fail{color:#c53030}
svg{display:block;margin:12px 0;background:#fff;border:1px solid #e2e8f0}
svg .t{font:bold 13px sans-serif}svg .l{font:11px sans-serif;fill:#4a5568}svg .ax{stroke:#4a5568}
svg .g{stroke:#edf2f7}table.errors td,table.errors th{text-align:left}"""


def render_page(*, title: str, command: str, summaries: Sequence[Summary], ratios: dict[str, float | None] | None,
                verdict: Verdict, results: Sequence[RequestResult], stream: bool, elapsed_s: float,
                interrupted: bool) -> str:  # fmt: skip
    ok = [[r for r in results if r.target == i and r.ok] for i in range(len(summaries))]
    failed = [[r for r in results if r.target == i and not r.ok] for i in range(len(summaries))]
    lat = [Series(s.target, COLOURS[i], [r.latency for r in ok[i]]) for i, s in enumerate(summaries)]
    charts = [histogram_svg("Latency of successful requests", lat)]
    if stream:
        ttft = [Series(s.target, COLOURS[i], [r.ttft for r in ok[i] if r.ttft is not None])
                for i, s in enumerate(summaries)]
        charts.append(histogram_svg("Time to first token", ttft))
    timeline = [Series(f"{s.target} ok", COLOURS[i], [r.started + r.latency for r in ok[i]])
                for i, s in enumerate(summaries)]
    timeline += [Series(f"{s.target} failed", FAIL_COLOURS[i], [r.started + r.latency for r in failed[i]])
                 for i, s in enumerate(summaries) if failed[i]]
    charts.append(timeline_svg("Completed requests per second", timeline, elapsed_s))
    cls = "pass" if verdict.passed else "fail"
    note = "<p><b>Interrupted</b>: partial results.</p>" if interrupted else ""
    reasons = f"<br>{escape('; '.join(verdict.reasons))}" if verdict.reasons else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n<h1>{escape(title)}</h1>\n"
            f"<p><code>{escape(command)}</code></p>{note}\n"
            f"<p class=\"{cls}\"><b>{verdict.label}</b> {escape(verdict.detail)}{reasons}</p>\n"
            f"{_table(summaries, ratios)}\n{''.join(_errors(s) for s in summaries)}\n"
            + "\n".join(charts) + "\n</body></html>\n")

"""The terminal side: a live progress bar while the load runs, then the summary tables (rich)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console, RenderableType
from rich.progress import Progress, ProgressColumn, Task, TextColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gateway.loadtool.client import RequestResult
from gateway.loadtool.stats import Percentiles, Summary, Verdict

RATE_WINDOW_S = 3.0


class LiveCounts:
    """What the progress bar shows, updated from the load's results (one event loop, no locks)."""

    def __init__(self, total_requests: int | None, duration_s: float | None) -> None:
        self.total_requests = total_requests
        self.duration_s = duration_s
        self.started = time.perf_counter()
        self.done = self.ok = self.failed = 0
        self._recent: deque[float] = deque()

    def add(self, result: RequestResult) -> None:
        self.done += 1
        if result.ok:
            self.ok += 1
        else:
            self.failed += 1
        self._recent.append(time.perf_counter())

    def rate(self) -> float:
        now = time.perf_counter()
        while self._recent and self._recent[0] < now - RATE_WINDOW_S:
            self._recent.popleft()
        window = min(RATE_WINDOW_S, now - self.started)
        return len(self._recent) / window if window > 0 else 0.0

    def fraction(self) -> float:
        if self.total_requests:
            return min(1.0, self.done / self.total_requests)
        if self.duration_s:
            return min(1.0, (time.perf_counter() - self.started) / self.duration_s)
        return 0.0


class _BarColumn(ProgressColumn):
    def __init__(self, counts: LiveCounts) -> None:
        super().__init__()
        self._counts = counts

    def render(self, task: Task) -> RenderableType:
        return ProgressBar(total=1000, completed=int(self._counts.fraction() * 1000), width=32)


class _CountsColumn(ProgressColumn):
    def __init__(self, counts: LiveCounts) -> None:
        super().__init__()
        self._counts = counts

    def render(self, task: Task) -> RenderableType:
        c = self._counts
        elapsed = time.perf_counter() - c.started
        done = f"{c.done}/{c.total_requests}" if c.total_requests else f"{c.done} in {elapsed:.0f}/{c.duration_s:g} s"
        text = Text(done + "  ")
        text.append(f"ok {c.ok}", style="green")
        text.append("  ")
        text.append(f"failed {c.failed}", style="red" if c.failed else "dim")
        text.append(f"  {c.rate():.1f} req/s")
        return text


class LiveProgress:
    """`with LiveProgress(console, counts): ...` shows the bar; results go to `counts.add`."""

    def __init__(self, console: Console, counts: LiveCounts, label: str) -> None:
        self._progress = Progress(TextColumn("[bold]{task.description}"), _BarColumn(counts), _CountsColumn(counts),
                                  console=console, transient=False, refresh_per_second=8)
        self._label = label

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        self._progress.add_task(self._label, total=None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self._progress.stop()


def fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.2f} s"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct_rows(name: str, p: Sequence[Percentiles | None]) -> list[tuple[str, list[str], str]]:
    return [(f"{name} {q}", [fmt_s(getattr(x, q) if x else None) for x in p], f"{name.split()[0]}_{q}")
            for q in ("p50", "p90", "p99")]


def summary_table(summaries: Sequence[Summary], ratios: dict[str, float | None] | None, stream: bool) -> Table:
    table = Table(title="Summary", title_justify="left", show_lines=False)
    table.add_column("")
    for s in summaries:
        table.add_column(f"{s.target}\n{s.base_url} ({s.model})", justify="right")
    if ratios is not None:
        table.add_column(f"{summaries[0].target} / {summaries[1].target}", justify="right")
    rows: list[tuple[str, list[str], str]] = [
        ("requests", [str(s.requests) for s in summaries], ""),
        ("success rate", [f"{s.success_rate:.1%} ({s.ok}/{s.requests})" for s in summaries], "success_rate"),
        ("status counts", ["  ".join(f"{k}: {v}" for k, v in s.status_counts.items()) or "-" for s in summaries], ""),
        ("latency mean", [fmt_s(s.latency_s.mean if s.latency_s else None) for s in summaries], "latency_mean"),
        *_pct_rows("latency", [s.latency_s for s in summaries]),
    ]
    if stream:
        rows += _pct_rows("ttft", [s.ttft_s for s in summaries])
    rows += [
        ("requests/s", [f"{s.requests_per_s:.2f}" if s.requests_per_s else "-" for s in summaries], "requests_per_s"),
        ("output tokens", [str(s.output_tokens) for s in summaries], ""),
        ("output tokens/s", [f"{s.output_tokens_per_s:.1f}" if s.output_tokens_per_s is not None else "- (no usage)"
                             for s in summaries], "output_tokens_per_s"),
    ]
    for label, cells, key in rows:
        extra = [fmt_ratio(ratios.get(key)) if key else ""] if ratios is not None else []
        table.add_row(label, *cells, *extra)
    return table


def errors_table(summary: Summary) -> Table:
    table = Table(title=f"Errors: {summary.target}", title_justify="left")
    table.add_column("type")
    table.add_column("count", justify="right")
    table.add_column("example message", overflow="fold")
    for group in summary.errors:
        table.add_row(group.kind, str(group.count), group.example)
    return table


def print_report(console: Console, summaries: Sequence[Summary], ratios: dict[str, float | None] | None,
                 verdict: Verdict, *, stream: bool, interrupted: bool, elapsed_s: float) -> None:  # fmt: skip
    if interrupted:
        console.print(f"[yellow bold]Interrupted[/] after {elapsed_s:.1f} s: partial results "
                      "(requests in flight were dropped).")
    console.print(summary_table(summaries, ratios, stream))
    for s in summaries:
        if s.errors:
            console.print(errors_table(s))
    style = "green bold" if verdict.passed else "red bold"
    line = Text(verdict.label, style=style) + Text(f"  {summaries[0].target}: {verdict.detail}")
    if verdict.reasons:
        line += Text(f"\n  failed: {'; '.join(verdict.reasons)}", style="red")
    console.print(line)

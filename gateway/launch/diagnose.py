"""Read a vLLM log and say which layer failed, with the evidence (``gateway backends diagnose``).

Pure: :func:`analyse` takes the log's text and returns a :class:`Diagnosis`; nothing here reads
files or prints. Only the last run in a launcher log counts (the launcher writes a
``===== ... gateway backends: starting NAME`` header before each start).

The root cause is the first line, in log order, that matches a ``cause`` signature
(``gateway.launch.signatures``): in a multi-GPU start the first rank to fail holds it, the other
ranks then only time out (NCCL watchdog) or report that the engine died. Those ``consequence``
lines decide only when no cause is in the log. A log with an error but no known signature gives
its last error block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gateway.launch.signatures import SIGNATURES, Signature

RUN_HEADER = re.compile(r"^===== .* gateway backends: starting ")
_PROCESS = re.compile(
    r"\((?P<proc>(?:Worker|VllmWorker\w*|RayWorker\w*|EngineCore\w*|APIServer)[\w]*)(?: rank=(?P<r1>\d+))? "
    r"pid=(?P<pid>\d+)\)"
)
_RANK = re.compile(r"\[rank(\d+)\]:|\[Rank (\d+)\]|\bWorker\w*_TP(\d+)\b")
_RANK_INIT = re.compile(r"world_size=(\d+) rank=(\d+) local_rank=(\d+) distributed_init_method=")
_PREFIX = re.compile(r"^(?:\([^)]*pid=\d+\) )?(?:\[rank\d+\]: ?)?"
                     r"(?:(?P<level>[A-Z]+) \d\d-\d\d [\d:]+ \[[^\]]+\] )?")
_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception|Exit)\b|^\S+: error: ")  # the latter: argparse
_ANY_ERROR = re.compile(r"\b(?:ERROR|CRITICAL) \d\d-\d\d |(?:^|\s|\]:)\[E[\s\d]")  # vLLM, c10 logs
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TRACEBACK = "Traceback (most recent call last):"
_READY = ("Application startup complete", "Starting vLLM API server", "Uvicorn running on")
MAX_QUOTE = 400


@dataclass(frozen=True)
class Evidence:
    signature: Signature
    line_no: int  # 1-based, within the analysed run
    line: str
    process: str | None  # e.g. "Worker_TP1 pid=123", "rank 1"
    cause: str
    change: str

    def quote(self) -> str:
        text = self.line.strip()
        return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


@dataclass
class Diagnosis:
    """What one run's log says; ``root`` is None for a healthy or unrecognised log."""

    lines: int
    root: Evidence | None = None
    related: list[Evidence] = field(default_factory=list)  # other causes/consequences, log order
    notes: list[Evidence] = field(default_factory=list)
    error_block: list[str] = field(default_factory=list)  # the last error, when nothing matched
    started: bool = False  # the API server reported it was serving
    silent: bool = False  # no error, but it never reported serving either: error_block is the log's end
    ranks: dict[int, int] = field(default_factory=dict)  # rank -> world size, from the init lines
    first_failed: str | None = None  # process/rank of the first line that failed
    failed: list[tuple[str, int]] = field(default_factory=list)  # (process, first line) in log order

    @property
    def healthy(self) -> bool:
        return self.root is None and not self.error_block

    @property
    def status(self) -> int:
        """0 healthy, 1 something is wrong (diagnosed or not)."""
        return 0 if self.healthy else 1


def last_run(text: str) -> str:
    """The part of a launcher log written by the last start (the whole text if no header)."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if RUN_HEADER.match(lines[i]):
            return "\n".join(lines[i:])
    return text


def process_of(line: str) -> str | None:
    """Which process or rank wrote a line: ``Worker_TP1 pid=42``, ``rank 3``... or None."""
    m = _PROCESS.search(line)
    if m is not None:
        proc = m.group("proc") + (f" rank={m.group('r1')}" if m.group("r1") else "")
        return f"{proc} pid={m.group('pid')}"
    r = _RANK.search(line)
    if r is not None:
        return f"rank {next(g for g in r.groups() if g is not None)}"
    return None


def match_line(line: str) -> tuple[Signature, re.Match[str]] | None:
    """The first signature (table order) that matches ``line``."""
    for sig in SIGNATURES:
        m = sig.pattern.search(line)
        if m is not None:
            return sig, m
    return None


def _body(line: str) -> tuple[str | None, str]:
    """(log level or None, the text after the process prefix and log header)."""
    m = _PREFIX.match(line)
    assert m is not None  # every part of the prefix is optional
    return m.group("level"), line[m.end():]


def _is_error(line: str) -> bool:
    level, body = _body(line)
    return level in ("ERROR", "CRITICAL") or (level is None and _EXCEPTION.match(body) is not None) \
        or _ANY_ERROR.search(line) is not None


def _error_block(lines: list[str]) -> list[str]:
    """The last traceback up to its exception line, else the last lines that look like errors."""
    for i in range(len(lines) - 1, -1, -1):
        if _TRACEBACK in lines[i]:
            block = lines[i:]
            for j in range(1, len(block)):
                if _EXCEPTION.match(_body(block[j])[1]):
                    block = block[: j + 1]
                    break
            if len(block) > 20:
                block = [*block[:8], "    ...", *block[-10:]]
            return block
    return [line for line in lines if _is_error(line)][-10:]


def analyse(text: str) -> Diagnosis:
    """Classify one vLLM log (the last run of it)."""
    lines = _ANSI.sub("", last_run(text)).splitlines()
    diag = Diagnosis(lines=len(lines))
    causes: list[Evidence] = []
    consequences: list[Evidence] = []
    seen: set[str] = set()
    after_file = False  # the line after a traceback's `File "...", line N` is source code, not a message
    for n, line in enumerate(lines, start=1):
        body = _body(line)[1].strip()
        source_line, after_file = after_file, body.startswith('File "')
        if source_line:
            continue
        if any(r in line for r in _READY):
            diag.started = True
        init = _RANK_INIT.search(line)
        if init is not None:
            diag.ranks[int(init.group(2))] = int(init.group(1))
        hit = match_line(line)
        if hit is None:
            continue
        sig, m = hit
        cause, change = sig.explain(m)
        ev = Evidence(sig, n, line, process_of(line), cause, change)
        if sig.kind == "note":
            if sig.id not in seen:
                diag.notes.append(ev)
        elif sig.kind == "cause":
            causes.append(ev)
        else:
            consequences.append(ev)
        seen.add(sig.id)
    ordered = causes or consequences
    if ordered:
        diag.root = ordered[0]
        diag.first_failed = ordered[0].process
        for ev in sorted(causes + consequences, key=lambda e: e.line_no):
            if ev.process and ev.process not in dict(diag.failed):
                diag.failed.append((ev.process, ev.line_no))
        firsts: dict[str, Evidence] = {}
        for ev in causes + consequences:
            firsts.setdefault(ev.signature.id, ev)
        diag.related = sorted((e for e in firsts.values() if e is not diag.root), key=lambda e: e.line_no)
        if not causes:  # only consequences: show what failed too
            diag.error_block = _error_block(lines)
        return diag
    if any(_TRACEBACK in line or _is_error(line) for line in lines):
        diag.error_block = _error_block(lines)
    elif not diag.started:  # still starting, or it died without a word (killed, or not vLLM's output)
        diag.silent = True
        diag.error_block = [line for line in lines if line.strip()][-10:]
    return diag

"""Start, watch and stop vLLM servers as child processes.

Each backend runs in a session (and process group) of its own, so stopping it reaches the API
server *and* the EngineCore / Worker processes it forks: SIGTERM goes to the whole group, SIGKILL
follows after a timeout. Output goes to a log file (appended, one header line per start).
Readiness is ``GET /health`` answering 200, polled; a process that exits while starting fails at
once with the tail of its log.

A small JSON state file (default ``var/run/backends.json``) records what was started (name, pid,
pgid, port, log), so ``gateway backends down`` can stop what a detached ``up`` left running. A
record whose processes are gone, or whose pid now belongs to another program (checked with the
process start time on Linux), is stale: it is dropped, nothing is signalled.

Processes are started with ``os.posix_spawnp`` rather than :class:`subprocess.Popen`: a detached
launcher exits while its children run on, which ``Popen`` reports as a leaked resource.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from gateway.launch.commands import LaunchCommand

DEFAULT_LOG_DIR = Path("var/log")
DEFAULT_STATE_DIR = Path("var/run")
STATE_FILE_NAME = "backends.json"
DEFAULT_STOP_TIMEOUT_S = 30.0
_PROC = Path("/proc")


class LaunchFailed(RuntimeError):
    """A backend could not be started or did not become ready; ``log_tail`` shows why."""

    def __init__(self, name: str, reason: str, log_file: str | None = None, log_tail: str = "") -> None:
        self.name = name
        self.reason = reason
        self.log_file = log_file
        self.log_tail = log_tail
        msg = f"backend {name!r}: {reason}"
        if log_tail:
            msg += f"\n--- last lines of {log_file} ---\n{log_tail.rstrip()}\n---"
        elif log_file:
            msg += f" (log: {log_file})"
        super().__init__(msg)


# --------------------------------------------------------------------------- processes (Linux /proc)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: str  # R, S, D, Z, ...
    pgid: int
    sid: int
    start_ticks: int  # since boot, in clock ticks


def proc_info(pid: int) -> ProcInfo | None:
    """``/proc/<pid>/stat`` parsed, or None if there is no such process (or no /proc)."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcInfo(pid=pid, state=rest[0], pgid=int(rest[2]), sid=int(rest[3]), start_ticks=int(rest[19]))
    except (IndexError, ValueError):
        return None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    if _PROC.is_dir():
        out = []
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            info = proc_info(int(entry.name))
            if info is not None and info.pgid == pgid and info.state not in ("Z", "X"):
                out.append(info.pid)
        return sorted(out)
    try:  # no /proc (macOS): the group exists or it does not
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        return [pgid]
    return [pgid]


# Exit codes of children reaped by pid-only code paths (stop_records), for BackendProcess.poll().
_EXIT_CODES: dict[int, int] = {}


def _reap(pid: int) -> int | None:
    """Collect our own child's exit status without blocking; None while it runs (or not ours)."""
    if pid in _EXIT_CODES:
        return _EXIT_CODES[pid]
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    _EXIT_CODES[pid] = code
    return code


def exit_description(code: int) -> str:
    """``exited with code 3`` / ``was killed by SIGKILL`` (from a waitpid exit code)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


# --------------------------------------------------------------------------- state file


@dataclass(frozen=True)
class BackendRecord:
    """What ``down`` needs to find a started backend again."""

    name: str
    pid: int
    pgid: int
    host: str
    port: int
    url: str
    log: str
    started_at: float  # time.time()
    start_ticks: int | None = None  # /proc start time of pid, to detect a reused pid
    launcher_pid: int = 0
    detached: bool = False
    stopping: bool = False  # set by stop_records before it signals (a foreground `up` reads it)

    def is_running(self) -> bool:
        return bool(self.live_members())

    def live_members(self) -> list[int]:
        """Processes of this backend still alive; [] when the record is stale."""
        info = proc_info(self.pid)
        if info is not None and self.start_ticks is not None and info.start_ticks != self.start_ticks:
            return []  # the pid was reused by an unrelated program
        if info is not None and info.pgid != self.pgid:
            return []
        if info is None and _PROC.is_dir():
            # Leader gone; its EngineCore/Worker may linger in the group (a crashed API server).
            return [p for p in group_members(self.pgid) if self._younger(p)]
        return group_members(self.pgid)

    def _younger(self, pid: int) -> bool:
        info = proc_info(pid)
        return info is not None and (self.start_ticks is None or info.start_ticks >= self.start_ticks)


class StateFile:
    """``backends.json``: {"backends": {name: record}}; updates are locked and atomic."""

    def __init__(self, state_dir: str | Path = DEFAULT_STATE_DIR) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE_NAME

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / (STATE_FILE_NAME + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict[str, BackendRecord]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return {}  # unreadable: treat as empty rather than block `down`
        out: dict[str, BackendRecord] = {}
        for name, rec in (data.get("backends") or {}).items():
            with contextlib.suppress(TypeError, ValueError):
                out[name] = BackendRecord(**rec)
        return out

    def _write(self, records: Mapping[str, BackendRecord]) -> None:
        tmp = self.path.with_suffix(f".tmp.{os.getpid()}")
        body = {"backends": {n: asdict(r) for n, r in sorted(records.items())}}
        tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.path)

    def load(self) -> dict[str, BackendRecord]:
        with self._locked():
            return self._read()

    def put(self, record: BackendRecord) -> None:
        with self._locked():
            records = self._read()
            records[record.name] = record
            self._write(records)

    def mark_stopping(self, names: Iterable[str]) -> None:
        with self._locked():
            records = self._read()
            for n in names:
                if n in records:
                    records[n] = replace(records[n], stopping=True)
            self._write(records)

    def remove(self, names: Iterable[str], only_pid: int | None = None) -> None:
        """Drop records (only the ones with that pid when ``only_pid`` is given)."""
        with self._locked():
            records = self._read()
            for n in names:
                if n in records and (only_pid is None or records[n].pid == only_pid):
                    del records[n]
            self._write(records)


# --------------------------------------------------------------------------- starting


def port_in_use(host: str, port: int, timeout: float = 0.5) -> bool:
    """Something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: Path, offset: int = 0, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(offset, end - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class BackendProcess:
    """A backend this process started (its parent): exit status is ours to collect."""

    command: LaunchCommand
    record: BackendRecord
    log_path: Path
    log_offset: int  # where this run's output starts in the log
    returncode: int | None = None
    ready_after_s: float | None = None
    _t0: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.command.name

    @property
    def pid(self) -> int:
        return self.record.pid

    def poll(self) -> int | None:
        """Exit code once the API server process has exited (and was reaped), else None."""
        if self.returncode is None:
            self.returncode = _reap(self.pid)
            if self.returncode is not None:
                _EXIT_CODES.pop(self.pid, None)
        return self.returncode

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, self.log_offset, lines)

    def failed(self, reason: str) -> LaunchFailed:
        return LaunchFailed(self.name, reason, str(self.log_path), self.log_tail())


def start_backend(
    command: LaunchCommand,
    *,
    log_path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    state: StateFile | None = None,
    detached: bool = False,
) -> BackendProcess:
    """Spawn one backend in a new session, output appended to its log file. Does not wait.

    Refuses when something already listens on the backend's port (it would fail to bind after
    loading the model, minutes later). Records it in ``state`` when given.
    """
    probe = urlsplit(command.local_url)
    if port_in_use(probe.hostname or command.host, command.port):
        raise LaunchFailed(
            command.name,
            f"port {command.port} ({command.local_url}) is already in use (another server, or this backend is "
            "already running: `gateway backends down` stops what `up` started)",
        )
    log = Path(log_path or command.log_file or DEFAULT_LOG_DIR / f"{command.name}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    env = command.child_env(os.environ if environ is None else environ)
    header = (
        f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} gateway backends: starting {command.name} "
        f"({command.url})\n===== {' '.join(command.argv)}\n"
    )
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        offset = os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, header.encode())
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid = os.posix_spawnp(
                command.argv[0],
                list(command.argv),
                env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0),
                    (os.POSIX_SPAWN_DUP2, fd, 1),
                    (os.POSIX_SPAWN_DUP2, fd, 2),
                ],
                setsid=True,
                setsigmask=(),
                setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE),
            )
        finally:
            os.close(devnull)
    except OSError as exc:
        reason = f"cannot run {command.argv[0]!r}: {exc.strerror or exc}"
        if exc.errno == errno.ENOENT:
            reason += " (launch.python must be an interpreter that has vLLM installed)"
        raise LaunchFailed(command.name, reason, str(log)) from None
    finally:
        os.close(fd)
    _EXIT_CODES.pop(pid, None)  # a reused pid: forget an earlier child's status
    info = proc_info(pid)
    record = BackendRecord(
        name=command.name,
        pid=pid,
        pgid=pid,  # setsid: the server leads its own session and process group
        host=command.host,
        port=command.port,
        url=command.url,
        log=str(log),
        started_at=time.time(),
        start_ticks=info.start_ticks if info is not None else None,
        launcher_pid=os.getpid(),
        detached=detached,
    )
    if state is not None:
        state.put(record)
    return BackendProcess(command=command, record=record, log_path=log, log_offset=offset)


def wait_ready(
    backends: Sequence[BackendProcess],
    *,
    poll_interval_s: float = 0.25,
    timeout_s: float | None = None,
    on_ready: Callable[[BackendProcess], None] | None = None,
) -> None:
    """Poll ``GET /health`` on every backend until each answers 200.

    Raises :class:`LaunchFailed` (with the log tail) as soon as one exits or passes its startup
    timeout (``launch.startup_timeout_s``, or ``timeout_s``); it does not stop anything: the caller
    decides (``stop_all``). Only backends this process spawned can be waited for.
    """
    pending = list(backends)
    with httpx.Client(trust_env=False, timeout=httpx.Timeout(2.0, connect=1.0)) as client:
        while pending:
            for b in list(pending):
                code = b.poll()
                if code is not None:
                    raise b.failed(f"the server {exit_description(code)} while starting")
                try:
                    r = client.get(f"{b.command.local_url}/health")
                    healthy = r.status_code == 200
                except httpx.HTTPError:
                    healthy = False
                elapsed = time.monotonic() - b._t0
                if healthy:
                    b.ready_after_s = elapsed
                    pending.remove(b)
                    if on_ready is not None:
                        on_ready(b)
                    continue
                limit = timeout_s if timeout_s is not None else b.command.startup_timeout_s
                if elapsed > limit:
                    raise b.failed(f"not ready after {limit:g} s (GET {b.command.local_url}/health never answered 200)")
            if pending:
                # Sleep until the next poll, but wake at once if a child exits.
                _wait_child_or_timeout(pending, poll_interval_s)


def _wait_child_or_timeout(backends: Sequence[BackendProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(b.poll() is not None for b in backends):
            return
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


# --------------------------------------------------------------------------- stopping


@dataclass(frozen=True)
class StopResult:
    name: str
    outcome: str  # "stopped", "killed", "not running", "stuck"
    seconds: float = 0.0

    def describe(self) -> str:
        if self.outcome == "stopped":
            return f"{self.name}: stopped (SIGTERM, {self.seconds:.1f} s)"
        if self.outcome == "killed":
            return f"{self.name}: killed (SIGKILL after {self.seconds:.1f} s; SIGTERM was not enough)"
        if self.outcome == "stuck":
            return f"{self.name}: still alive {self.seconds:.0f} s after SIGKILL (record kept; see `ps`)"
        return f"{self.name}: not running (stale record removed)"


def stop_records(
    records: Sequence[BackendRecord], *, timeout_s: float = DEFAULT_STOP_TIMEOUT_S, state: StateFile | None = None
) -> list[StopResult]:
    """SIGTERM every backend's process group at once, SIGKILL what is left after ``timeout_s``.

    Waits until no process of any group is alive (reaping our own children on the way), then
    removes the records from ``state``.
    """
    t0 = time.monotonic()
    live: dict[str, BackendRecord] = {}
    results: dict[str, StopResult] = {}
    if state is not None:
        state.mark_stopping([r.name for r in records])
    for rec in records:
        if rec.live_members():
            _signal_group(rec.pgid, signal.SIGTERM)
            live[rec.name] = rec
        else:
            _reap(rec.pid)
            results[rec.name] = StopResult(rec.name, "not running")
    killed: set[str] = set()
    while live:
        for name, rec in list(live.items()):
            _reap(rec.pid)
            if not group_members(rec.pgid):
                results[name] = StopResult(name, "killed" if name in killed else "stopped", time.monotonic() - t0)
                del live[name]
        if not live:
            break
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            for name, rec in live.items():
                if name not in killed:
                    _signal_group(rec.pgid, signal.SIGKILL)
                    killed.add(name)
            if elapsed > timeout_s + 30:  # unkillable (uninterruptible I/O): report, keep the record
                for name in list(live):
                    results[name] = StopResult(name, "stuck", elapsed)
                break
        time.sleep(0.05)
    if state is not None:
        state.remove([r.name for r in records if results[r.name].outcome != "stuck"])
    return [results[r.name] for r in records if r.name in results]


def stop_backends(
    backends: Sequence[BackendProcess], *, timeout_s: float = DEFAULT_STOP_TIMEOUT_S, state: StateFile | None = None
) -> list[StopResult]:
    results = stop_records([b.record for b in backends], timeout_s=timeout_s, state=state)
    for b in backends:
        b.poll()
    return results

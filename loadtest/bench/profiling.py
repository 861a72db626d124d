"""py-spy on the gateway under load, and a summary of where its time goes (see loadtest/README.md)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from loadtest.bench.loadgen import Raw, perf, run_load
from loadtest.bench.scenarios import Scenario

ROOT = Path(__file__).resolve().parents[2]


def find_py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Top costs from py-spy's raw (collapsed stacks) output; each sample is one frame stack.

    - ``gateway_self``: each sample charged to its innermost gateway frame, so the library work a
      gateway function asks for is billed to that function;
    - ``gateway_calls``: the same, split by the library function the gateway frame called;
    - ``library_inclusive``: frames below the innermost gateway frame (what those calls cost inside
      httpx, uvicorn, ...), counted once per sample;
    - ``gateway_inclusive``: gateway frames anywhere on the stack;
    - ``self``: the innermost frame of any code.
    """
    total = 0
    own: dict[str, int] = {}
    gw_self: dict[str, int] = {}
    gw_calls: dict[str, int] = {}
    lib_incl: dict[str, int] = {}
    gw_incl: dict[str, int] = {}
    # Shorter names: gateway/..., httpx/..., <stdlib>/asyncio/...
    prefixes = [(sysconfig.get_paths()["purelib"] + "/", ""), (sysconfig.get_paths()["stdlib"] + "/", "<stdlib>/"),
                (str(ROOT) + "/", "")]

    def short(frame: str) -> str:
        for old, new in prefixes:
            frame = frame.replace(old, new)
        return frame

    def add(d: dict[str, int], k: str, n: int) -> None:
        d[k] = d.get(k, 0) + n

    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        frames = [short(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        add(own, frames[-1], count)
        gw_at = [i for i, f in enumerate(frames) if "(gateway/" in f]
        for f in dict.fromkeys(frames[i] for i in gw_at):
            add(gw_incl, f, count)
        if not gw_at:
            continue
        inner = gw_at[-1]
        add(gw_self, frames[inner], count)
        callee = frames[inner + 1] if inner + 1 < len(frames) else "(own code)"
        add(gw_calls, f"{frames[inner]} -> {callee}", count)
        for f in dict.fromkeys(frames[inner + 1:]):
            add(lib_incl, f, count)

    def ranked(d: dict[str, int], n: int = top) -> list[dict[str, Any]]:
        items = sorted(d.items(), key=lambda kv: -kv[1])[:n]
        return [{"frame": k, "samples": v, "pct": round(100.0 * v / total, 1) if total else 0.0} for k, v in items]

    return {"samples": total, "gateway_self": ranked(gw_self), "gateway_calls": ranked(gw_calls),
            "library_inclusive": ranked(lib_incl, 2 * top), "gateway_inclusive": ranked(gw_incl),
            "self": ranked(own)}


async def profile_gateway(py_spy: str, gw_pid: int, sc: Scenario, port: int, concurrency: int, seconds: float,
                          out: Path, timeout_s: float) -> tuple[Raw, dict[str, Any]]:
    cmd = [py_spy, "record", "--pid", str(gw_pid), "--rate", "100", "--format", "raw", "--function",
           "--full-filenames", "--output", str(out)]
    # py-spy reports on stdout; stderr is merged so that neither pipe can fill up.
    spy = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert spy.stdout is not None
    said = b""
    try:
        async with asyncio.timeout(30):  # until py-spy says it is sampling
            while b"Sampling" not in (line := await spy.stdout.readline()):
                said += line
                if not line:
                    raise RuntimeError(f"py-spy exited with {await spy.wait()}: {said.decode(errors='replace')}")
        raw = await run_load(sc, port, 10**9, concurrency, {"gateway": [gw_pid]}, timeout_s,
                             stop_at=perf() + seconds)
        spy.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            said += await spy.stdout.read()
            await spy.wait()
    finally:
        if spy.returncode is None:
            spy.kill()
            await spy.wait()
    try:
        return raw, summarize_profile(out)
    except OSError:
        raise RuntimeError(f"py-spy wrote no profile: {said.decode(errors='replace')[-500:]}") from None

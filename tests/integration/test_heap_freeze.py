"""``gateway serve`` freezes what start-up built (gc.freeze), so that a full garbage collection under
load scans only what requests made (~80 ms of every stream on hold otherwise). Each case runs in its
own interpreter: freezing is process-wide and would keep the test process's garbage."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import asyncio, gc, sys, time, yaml
    from gateway.app import create_app
    from gateway.config import parse_config
    from gateway.settings import Settings

    cfg = parse_config(yaml.safe_dump({
        "models": [{"id": "m", "upstreams": [{"url": "http://127.0.0.1:9/v1", "model": "x"}]}],
        "keys": [{"name": "k", "key": "sk-test-0123456789abcdef"}],
        "health": {"interval_s": 30},
    }), {})
    app = create_app(Settings(access_log=False), cfg, freeze_heap=sys.argv[1] == "on")

    async def main() -> None:
        inbox: asyncio.Queue = asyncio.Queue()
        outbox: asyncio.Queue = asyncio.Queue()
        await inbox.put({"type": "lifespan.startup"})
        task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                       inbox.get, outbox.put))
        assert (await outbox.get())["type"] == "lifespan.startup.complete"
        frozen = gc.get_freeze_count()
        t = time.perf_counter()
        gc.collect()
        print(frozen, round((time.perf_counter() - t) * 1000, 1))
        await inbox.put({"type": "lifespan.shutdown"})
        await task

    asyncio.run(main())
""")


@pytest.mark.parametrize("freeze", ["on", "off"])
def test_start_up_objects_are_frozen_only_when_asked(freeze: str) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, freeze], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    frozen, _collect_ms = out.stdout.split()
    if freeze == "on":
        assert int(frozen) > 20_000  # the whole start-up heap (~85,000 objects)
    else:
        assert int(frozen) == 0

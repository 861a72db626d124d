"""Where this gateway process is in its life: what ``/health/ready`` reports.

Readiness is about the gateway itself: started (config loaded, services built, first health round
done), and not draining. It never depends on the backends: with one model's backends down, every
replica stays ready and keeps serving the other models (and a clean 503 for the dead one), instead
of an orchestrator removing all replicas. Backend and model health are reported beside it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Lifecycle:
    started: bool = False
    draining: bool = False
    cutting: bool = False  # the graceful-shutdown period is over: open streams are being ended
    active: set[asyncio.Task[Any]] = field(default_factory=set)  # tasks serving a proxied request now

    def cut_streams(self) -> int:
        """Cancel every proxied request still running: a stream ends with an error event, a request
        not answered yet gets a 503 (see :meth:`absorb_cut`)."""
        self.cutting = True
        tasks = [t for t in self.active if not t.done()]
        for t in tasks:
            t.cancel()
        return len(tasks)

    def absorb_cut(self) -> bool:
        """In ``except CancelledError``: True (the cancellation undone) when the shutdown cut this
        request, so it can end it properly."""
        task = asyncio.current_task()
        if self.cutting and task is not None and task in self.active:
            task.uncancel()
            return True
        return False

    @property
    def ready(self) -> bool:
        return self.started and not self.draining

    @property
    def state(self) -> str:
        if self.draining:
            return "draining"
        return "ready" if self.started else "starting"

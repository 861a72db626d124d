"""A cheap idle/total deadline for reading a body chunk by chunk.

``asyncio.timeout`` + ``reschedule()`` per chunk re-arms a timer for every SSE event. This timer
is armed once per idle period instead: each chunk only records the time, and when the timer fires
it either re-arms for the remaining time or cancels the reading task.
"""

from __future__ import annotations

import asyncio


class IdleTimer:
    __slots__ = ("_deadline", "_handle", "_idle", "_loop", "_task", "expired", "last")

    def __init__(self, idle: float, deadline: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._idle = idle
        self._deadline = deadline
        self.expired = False
        self.last = self._loop.time()
        self._handle = self._loop.call_at(min(self.last + idle, deadline), self._check)

    def touch(self) -> None:
        """Call whenever data arrived."""
        self.last = self._loop.time()

    def _check(self) -> None:
        due = min(self.last + self._idle, self._deadline)
        if self._loop.time() >= due:
            self.expired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(due, self._check)

    def absorb(self) -> bool:
        """In ``except CancelledError``: True (and the cancellation undone) when this timer caused it."""
        if self.expired:
            self._task.uncancel()
            return True
        return False

    def total_exceeded(self) -> bool:
        return self._loop.time() >= self._deadline

    def stop(self) -> None:
        self._handle.cancel()

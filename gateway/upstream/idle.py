"""A cheap idle/total deadline for reading a body chunk by chunk.

``asyncio.timeout`` + ``reschedule()`` per chunk re-arms a timer for every SSE event. This timer
is armed once per idle period instead: each chunk only records the time, and when the timer fires
it either re-arms for the remaining time or cancels the reading task.

While the task is blocked handing data to a slow client (between :meth:`sending` and the next
:meth:`touch`), the upstream is not silent: the idle limit is suspended and the ``stall`` limit
applies instead, so a client that stops reading is cut as the client's failure
(:attr:`client_stalled`), never as upstream silence.
"""

from __future__ import annotations

import asyncio


class IdleTimer:
    __slots__ = ("_deadline", "_handle", "_idle", "_loop", "_stall", "_task", "blocked", "client_stalled",
                 "expired", "last")

    def __init__(self, idle: float, deadline: float, stall: float | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._idle = idle
        self._deadline = deadline
        self._stall = idle if stall is None else stall
        self.blocked = False
        self.client_stalled = False
        self.expired = False
        self.last = self._loop.time()
        self._handle = self._loop.call_at(min(self.last + idle, deadline), self._check)

    def touch(self) -> None:
        """Call whenever data arrived, and after data was handed to the client (ends :meth:`sending`)."""
        self.last = self._loop.time()
        self.blocked = False

    def sending(self) -> None:
        """Call right after :meth:`touch`, before handing data to the client (which may block)."""
        self.blocked = True

    def _check(self) -> None:
        blocked = self.blocked
        due = min(self.last + (self._stall if blocked else self._idle), self._deadline)
        now = self._loop.time()
        if now >= due:
            self.expired = True
            self.client_stalled = blocked and now < self._deadline
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
